package storage

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"io/fs"
	"mime/multipart"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// backend is one Store under test with what the shared tests need to know
// about it beyond the interface.
type backend struct {
	store Store
	// expiredPost returns the URL and fields of an upload of key whose
	// policy, correctly signed, expired an hour ago.
	expiredPost func(t *testing.T, key string) (string, map[string]string)
	// expiredGet returns a correctly signed download URL of key that
	// expired an hour ago.
	expiredGet func(t *testing.T, key string) string
	// leftovers lists everything the store holds: object keys, and for the
	// local backend every file under its directory.
	leftovers func(t *testing.T) []string
	// minio is set for a MinIO server, whose error codes differ from AWS's
	// in a few cases.
	minio bool
}

// startLocal serves a Local on a loopback port; it returns the store, its
// data directory and the listener's address.
func startLocal(t *testing.T, opts LocalOptions) (*Local, string, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	if opts.PublicBaseURL == "" {
		opts.PublicBaseURL = "http://" + ln.Addr().String()
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	l, err := NewLocal(opts)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- l.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return l, opts.DataDir, ln.Addr().String()
}

func localBackend(t *testing.T) (backend, *Local) {
	l, dataDir, _ := startLocal(t, LocalOptions{})
	return backend{
		store: l,
		expiredPost: func(t *testing.T, key string) (string, map[string]string) {
			url, fields, err := l.presignPost(key, 1<<20, time.Now().Add(-2*time.Hour), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return url, fields
		},
		expiredGet: func(t *testing.T, key string) string {
			return l.presignGet(key, time.Now().Add(-2*time.Hour), time.Hour)
		},
		leftovers: func(t *testing.T) []string { return filesUnder(t, filepath.Join(dataDir, "objects")) },
	}, l
}

// filesUnder lists the files (not directories) below dir.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// multipartBody encodes a browser upload: every field (sorted by name, any
// order works), then the file, then extra fields S3 ignores.
func multipartBody(t *testing.T, fields map[string]string, file []byte, after map[string]string) (body []byte, contentType string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := writeForm(mw, fields, bytes.NewReader(file), after); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), mw.FormDataContentType()
}

func writeForm(mw *multipart.Writer, fields map[string]string, file io.Reader, after map[string]string) error {
	for _, name := range sortedKeys(fields) {
		if err := mw.WriteField(name, fields[name]); err != nil {
			return err
		}
	}
	if file != nil {
		fw, err := mw.CreateFormFile("file", "input.ndjson")
		if err != nil {
			return err
		}
		if _, err := io.Copy(fw, file); err != nil {
			return err
		}
	}
	for _, name := range sortedKeys(after) {
		if err := mw.WriteField(name, after[name]); err != nil {
			return err
		}
	}
	return mw.Close()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// upload posts the form the way spec 4.4 says a client does: no
// Authorization header, the file last.
func upload(t *testing.T, url string, fields map[string]string, file []byte) (int, []byte) {
	t.Helper()
	return uploadWith(t, url, fields, file, nil)
}

func uploadWith(t *testing.T, url string, fields map[string]string, file []byte, after map[string]string) (int, []byte) {
	t.Helper()
	body, contentType := multipartBody(t, fields, file, after)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	if req.Header.Get("Authorization") != "" {
		t.Fatal("the upload must carry no Authorization header")
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return resp.StatusCode, body
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

// errorCode reads the Code of an S3 XML error body; "" when there is none.
func errorCode(body []byte) string {
	var e struct {
		Code string `xml:"Code"`
	}
	_ = xml.Unmarshal(body, &e)
	return e.Code
}

func wantS3Error(t *testing.T, status int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus || errorCode(body) != wantCode {
		t.Fatalf("got %d %q, want %d %s\n%s", status, errorCode(body), wantStatus, wantCode, body)
	}
}

// readAll returns a function that reads a stream to its end:
// readAll(t)(s.Open(ctx, key)).
func readAll(t *testing.T) func(io.ReadCloser, error) string {
	return func(rc io.ReadCloser, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		data, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
}

func wantNotExist(t *testing.T, s Store, key string) {
	t.Helper()
	if _, err := s.Stat(context.Background(), key); !errors.Is(err, ErrNotExist) {
		t.Fatalf("Stat(%s) = %v, want ErrNotExist", key, err)
	}
}

// ndjson is a batch input file of n lines.
func ndjson(n int) []byte {
	var b strings.Builder
	for i := range n {
		b.WriteString(`{"text":"line `)
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString("\"}\n")
	}
	return []byte(b.String())
}

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor
