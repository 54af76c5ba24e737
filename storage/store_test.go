package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// testStore runs the batch flow of spec 4.3-4.9 against one backend, the
// way a client and the gateway would, and every refusal of an upload.
func testStore(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.store

	t.Run("UploadReadDownloadDelete", func(t *testing.T) {
		key := "batch/acct-1/job-1/input.ndjson"
		content := ndjson(500)
		url, fields, err := s.PresignPost(ctx, key, 1<<20, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"key", "policy", "x-amz-signature"} {
			if fields[name] == "" {
				t.Fatalf("upload fields %v lack %s", fields, name)
			}
		}
		if fields["key"] != key {
			t.Fatalf("key field %q, want %q (the batch API returns it as input_key)", fields["key"], key)
		}
		wantNotExist(t, s, key)
		if status, body := upload(t, url, fields, content); status != http.StatusNoContent {
			t.Fatalf("upload: %d\n%s", status, body)
		}

		info, err := s.Stat(ctx, key)
		if err != nil || info.Size != int64(len(content)) || info.Version == "" {
			t.Fatalf("Stat = %+v, %v; want %d bytes and a version", info, err, len(content))
		}
		if got := readAll(t)(s.Open(ctx, key)); got != string(content) {
			t.Fatalf("Open read %d bytes, want the %d uploaded", len(got), len(content))
		}
		for _, offset := range []int64{1, 1000, int64(len(content)) - 1, int64(len(content))} {
			if got := readAll(t)(s.OpenAt(ctx, key, offset)); got != string(content[offset:]) {
				t.Fatalf("OpenAt(%d) read %q, want %q", offset, got, content[offset:])
			}
		}
		if rc, err := s.OpenAt(ctx, key, int64(len(content))+1); err == nil {
			rc.Close()
			t.Fatal("OpenAt past the end succeeded")
		}

		// Uploaded again with the same size, the object has another
		// version: a batch job's input replaced mid-run is told by it.
		same := []byte(strings.ToUpper(string(content)))
		if status, body := upload(t, url, fields, same); status != http.StatusNoContent {
			t.Fatalf("second upload: %d\n%s", status, body)
		}
		if again, err := s.Stat(ctx, key); err != nil || again.Size != info.Size || again.Version == info.Version {
			t.Fatalf("Stat after a same-size upload = %+v, %v; want size %d and a version other than %q", again, err, info.Size, info.Version)
		}
		if status, body := upload(t, url, fields, content); status != http.StatusNoContent {
			t.Fatalf("third upload: %d\n%s", status, body)
		}

		download, _, err := s.PresignGet(ctx, key, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if status, body := get(t, download); status != http.StatusOK || string(body) != string(content) {
			t.Fatalf("presigned GET: %d, %d bytes; want 200 and the %d uploaded", status, len(body), len(content))
		}

		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		wantNotExist(t, s, key)
		if _, err := s.Open(ctx, key); !errors.Is(err, ErrNotExist) {
			t.Fatalf("Open after Delete = %v, want ErrNotExist", err)
		}
		if err := s.Delete(ctx, key); err != nil {
			t.Fatalf("deleting a missing key: %v", err)
		}
		if left := b.leftovers(t); len(left) != 0 {
			t.Fatalf("after Delete the store holds %v", left)
		}
	})

	t.Run("CreateCommitAbort", func(t *testing.T) {
		key := "batch/acct-1/job-2/results.ndjson"
		u, err := s.Create(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Abort() // after Commit: nothing
		want := ndjson(2000)
		for i := 0; i < len(want); i += 777 {
			if _, err := u.Write(want[i:min(i+777, len(want))]); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				wantNotExist(t, s, key) // nothing visible before Commit
			}
		}
		if err := u.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t)(s.Open(ctx, key)); got != string(want) {
			t.Fatalf("read back %d bytes, want %d", len(got), len(want))
		}

		// A new write that is aborted leaves the old object as it was.
		u2, err := s.Create(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := u2.Write([]byte("partial")); err != nil {
			t.Fatal(err)
		}
		u2.Abort()
		u2.Abort()
		if err := u2.Commit(); err == nil {
			t.Fatal("Commit after Abort succeeded")
		}
		if got := readAll(t)(s.Open(ctx, key)); got != string(want) {
			t.Fatalf("after an aborted rewrite: %d bytes, want the %d committed", len(got), len(want))
		}
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		if left := b.leftovers(t); len(left) != 0 {
			t.Fatalf("after Abort and Delete the store holds %v", left)
		}
	})

	t.Run("RefusedUploads", func(t *testing.T) {
		const key = "batch/acct-1/job-3/input.ndjson"
		content := ndjson(50)
		fresh := func(t *testing.T, maxBytes int64) (string, map[string]string) {
			url, fields, err := s.PresignPost(ctx, key, maxBytes, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			return url, fields
		}
		for _, tc := range []struct {
			name       string
			form       func(t *testing.T) (string, map[string]string)
			file       []byte
			wantStatus int
			wantCode   string
			// minio is MinIO's answer where it differs from AWS's, which
			// the local backend gives.
			minio *s3Answer
		}{
			{"ForgedSignature", func(t *testing.T) (string, map[string]string) {
				url, fields := fresh(t, 1<<20)
				fields["x-amz-signature"] = flipLastHex(fields["x-amz-signature"])
				return url, fields
			}, content, 403, "SignatureDoesNotMatch", nil},
			{"PolicyOfAnotherUpload", func(t *testing.T) (string, map[string]string) {
				url, fields := fresh(t, 1<<20)
				_, other, err := s.PresignPost(ctx, "batch/acct-2/job-9/input.ndjson", 1<<20, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				fields["policy"] = other["policy"]
				return url, fields
			}, content, 403, "SignatureDoesNotMatch", nil},
			{"ExpiredPolicy", func(t *testing.T) (string, map[string]string) {
				return b.expiredPost(t, key)
			}, content, 403, "AccessDenied", nil},
			{"OtherKeyThanThePolicys", func(t *testing.T) (string, map[string]string) {
				url, fields := fresh(t, 1<<20)
				fields["key"] = "batch/acct-2/job-9/input.ndjson"
				return url, fields
			}, content, 403, "AccessDenied", nil},
			{"OversizeByOneByte", func(t *testing.T) (string, map[string]string) {
				return fresh(t, int64(len(content))-1)
			}, content, 400, "EntityTooLarge", nil},
			{"OversizeByMegabytes", func(t *testing.T) (string, map[string]string) {
				return fresh(t, 1<<10)
			}, bytes.Repeat(content, (8<<20)/len(content)), 400, "EntityTooLarge", nil},
			{"EmptyFile", func(t *testing.T) (string, map[string]string) {
				return fresh(t, 1<<20)
			}, []byte{}, 400, "EntityTooSmall", nil},
			{"MissingSignature", func(t *testing.T) (string, map[string]string) {
				url, fields := fresh(t, 1<<20)
				delete(fields, "x-amz-signature")
				return url, fields
			}, content, 400, "InvalidArgument", &s3Answer{403, "SignatureDoesNotMatch"}},
			{"MissingPolicy", func(t *testing.T) (string, map[string]string) {
				url, fields := fresh(t, 1<<20)
				delete(fields, "policy")
				return url, fields
			}, content, 400, "InvalidArgument", &s3Answer{403, "SignatureDoesNotMatch"}},
			{"NoFile", func(t *testing.T) (string, map[string]string) {
				return fresh(t, 1<<20)
			}, nil, 400, "InvalidArgument", &s3Answer{400, "MalformedPOSTRequest"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				url, fields := tc.form(t)
				var status int
				var body []byte
				if tc.file == nil {
					status, body = uploadWithoutFile(t, url, fields)
				} else {
					status, body = upload(t, url, fields, tc.file)
				}
				want := s3Answer{tc.wantStatus, tc.wantCode}
				if b.minio && tc.minio != nil {
					want = *tc.minio
				}
				wantS3Error(t, status, body, want.status, want.code)
				wantNotExist(t, s, key)
				if left := b.leftovers(t); len(left) != 0 {
					t.Fatalf("a refused upload left %v", left)
				}
			})
		}
	})

	t.Run("RefusedDownloads", func(t *testing.T) {
		key := "batch/acct-1/job-4/results.ndjson"
		putResults(t, s, key)
		good, _, err := s.PresignGet(ctx, key, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if status, body := get(t, good); status != http.StatusOK {
			t.Fatalf("the untampered URL: %d\n%s", status, body)
		}
		tampered := good[:len(good)-1] + string(flipLastHex(good[len(good)-1:]))
		status, body := get(t, tampered)
		wantS3Error(t, status, body, 403, "SignatureDoesNotMatch")
		status, body = get(t, strings.Replace(good, "results.ndjson", "input.ndjson", 1))
		wantS3Error(t, status, body, 403, "SignatureDoesNotMatch")
		status, body = get(t, b.expiredGet(t, key))
		wantS3Error(t, status, body, 403, "AccessDenied")
		status, body = get(t, good[:strings.IndexByte(good, '?')])
		wantS3Error(t, status, body, 403, "AccessDenied")
	})

	// The expiry PresignGet tells (the batch API's expires_at) was ttl
	// after the call, up to a second after the link really expired:
	// SigV4 signs whole seconds. Fetched just before it, the link was
	// refused as expired.
	t.Run("DownloadExpiresWhenSaid", func(t *testing.T) {
		key := "batch/acct-1/job-5/results.ndjson"
		putResults(t, s, key)
		var link string
		var expires time.Time
		var err error
		for range 5 {
			asked := time.Now()
			link, expires, err = s.PresignGet(ctx, key, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			signed := testutil.PresignedExpiry(t, link)
			// A second begun between the clock read and the signing
			// gives a link a second longer than said.
			if expires.After(signed) || expires.Before(signed.Add(-time.Second)) || expires.After(asked.Add(2*time.Second)) {
				t.Fatalf("PresignGet at %s said the link expires at %s; it was signed to expire at %s",
					asked.UTC().Format(time.RFC3339Nano), expires.UTC().Format(time.RFC3339Nano), signed.UTC().Format(time.RFC3339))
			}
			time.Sleep(170 * time.Millisecond) // another fraction of a second
		}
		time.Sleep(time.Until(expires.Add(-150 * time.Millisecond)))
		if status, body := get(t, link); status != http.StatusOK {
			t.Fatalf("fetched 150ms before the expiry said: %d\n%s", status, body)
		}
		time.Sleep(time.Until(testutil.PresignedExpiry(t, link).Add(1100 * time.Millisecond)))
		status, body := get(t, link)
		wantS3Error(t, status, body, 403, "AccessDenied")
	})
}

// putResults stores a one-line results file at key, deleted when the
// test ends.
func putResults(t *testing.T, s Store, key string) {
	t.Helper()
	ctx := context.Background()
	u, err := s.Create(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(u, `{"label":"a","confidence":0.9,"tokens":3}`+"\n")
	if err := u.Commit(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Delete(ctx, key) })
}

type s3Answer struct {
	status int
	code   string
}

// uploadWithoutFile posts the fields and no file part.
func uploadWithoutFile(t *testing.T, url string, fields map[string]string) (int, []byte) {
	t.Helper()
	body, contentType := multipartBodyNoFile(t, fields)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	return do(t, req)
}

func multipartBodyNoFile(t *testing.T, fields map[string]string) ([]byte, string) {
	t.Helper()
	var buf strings.Builder
	mw := multipart.NewWriter(&buf)
	if err := writeForm(mw, fields, nil, nil); err != nil {
		t.Fatal(err)
	}
	return []byte(buf.String()), mw.FormDataContentType()
}

// flipLastHex changes the last hex digit of s.
func flipLastHex(s string) string {
	last := s[len(s)-1]
	repl := byte('0')
	if last == '0' {
		repl = '1'
	}
	return s[:len(s)-1] + string(repl)
}
