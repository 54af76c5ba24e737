package storage

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

func TestLocal(t *testing.T) {
	b, _ := localBackend(t)
	testStore(t, b)
}

func TestCheckKey(t *testing.T) {
	for _, key := range []string{
		"batch/acct-1/0192f0c4-7a2b-7cde-8f00-1234567890ab/input.ndjson",
		"a", "with space/and+plus/ünïcode", "dots.in.name/..x/x..",
	} {
		if err := CheckKey(key); err != nil {
			t.Errorf("CheckKey(%q) = %v", key, err)
		}
	}
	for _, key := range []string{
		"", "/abs", "a/../b", "..", "a/./b", "a//b", "a/", "back\\slash", "nul\x00", "tab\there",
		strings.Repeat("k", 1025), "\xff",
	} {
		if err := CheckKey(key); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("CheckKey(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	l, _, _ := startLocal(t, LocalOptions{})
	ctx := context.Background()
	if _, err := l.Create(ctx, "../escape"); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Create(../escape) = %v, want ErrInvalidKey", err)
	}
	if _, _, err := l.PresignPost(ctx, "/etc/passwd", 10, time.Minute); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("PresignPost(/etc/passwd) = %v, want ErrInvalidKey", err)
	}
}

// TestLocalAcceptsMinioGoSignatures checks the local verifier against an
// independent SigV4 implementation: a POST policy and a presigned GET made
// by minio-go for the local backend's credential are accepted.
func TestLocalAcceptsMinioGoSignatures(t *testing.T) {
	const secret = "cross-check-secret"
	l, _, addr := startLocal(t, LocalOptions{SecretKey: secret})
	c, err := minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(LocalAccessKey, secret, ""), Region: LocalRegion})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := "batch/acct 1/job+1/input ü.ndjson" // encoding matters in the path
	p := minio.NewPostPolicy()
	for _, err := range []error{p.SetBucket(LocalBucket), p.SetKey(key), p.SetExpires(time.Now().Add(time.Hour)), p.SetContentLengthRange(1, 1<<20)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	u, fields, err := c.PresignedPostPolicy(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	content := ndjson(10)
	if status, body := upload(t, u.String(), fields, content); status != http.StatusNoContent {
		t.Fatalf("upload signed by minio-go: %d\n%s", status, body)
	}
	g, err := c.PresignedGetObject(ctx, LocalBucket, key, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := get(t, g.String()); status != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("download signed by minio-go: %d\n%s", status, body)
	}
	// And ours is what minio-go would send, byte for byte, for this key.
	ours, _, err := l.PresignGet(ctx, key, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := get(t, ours); status != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("our download URL %s: %d\n%s", ours, status, body)
	}
	if strings.Split(ours, "?")[0] != strings.Split(g.String(), "?")[0] {
		t.Fatalf("our URL path %s differs from minio-go's %s", ours, g)
	}
}

// TestLocalFormFieldsAsBrowsersSendThem: S3 field names are
// case-insensitive, x-ignore-* fields and fields after the file are
// ignored, and success_action_status picks the answer.
func TestLocalFormFieldsAsBrowsersSendThem(t *testing.T) {
	l, _, _ := startLocal(t, LocalOptions{})
	ctx := context.Background()
	key := "batch/acct-1/job-5/input.ndjson"
	url, fields, err := l.PresignPost(ctx, key, 1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	capitalized := map[string]string{"x-ignore-tracking": "1"}
	for name, v := range fields {
		switch name {
		case "policy":
			capitalized["Policy"] = v
		case "key":
			capitalized[name] = v
		default:
			capitalized[http.CanonicalHeaderKey(name)] = v // X-Amz-Credential
		}
	}
	status, body := uploadWith(t, url, capitalized, ndjson(3), map[string]string{"x-amz-meta-after-file": "ignored"})
	if status != http.StatusNoContent {
		t.Fatalf("capitalized fields: %d\n%s", status, body)
	}

	// success_action_status must be in the policy like any other field.
	fields["success_action_status"] = "201"
	status, body = upload(t, url, fields, ndjson(3))
	wantS3Error(t, status, body, 403, "AccessDenied")
	if !strings.Contains(string(body), "Extra input fields: success_action_status") {
		t.Fatalf("the refusal does not name the extra field:\n%s", body)
	}
	signed := signPolicy(t, l, `{"expiration":"`+time.Now().Add(time.Hour).UTC().Format(policyTimeFormat)+`","conditions":[
		{"bucket":"tollgate"},["starts-with","$key","batch/acct-1/"],{"success_action_status":"201"},
		["content-length-range","1","100"],
		{"x-amz-algorithm":"AWS4-HMAC-SHA256"},["eq","$x-amz-credential","`+"%CRED%"+`"],["starts-with","$x-amz-date",""]]}`)
	signed["key"] = "batch/acct-1/job-6/input.ndjson"
	signed["success_action_status"] = "201"
	status, body = upload(t, url, signed, []byte("{}\n"))
	var created struct {
		Key, Bucket, ETag string
	}
	if status != http.StatusCreated || xml.Unmarshal(body, &created) != nil || created.Key != signed["key"] || created.Bucket != LocalBucket {
		t.Fatalf("success_action_status 201: %d\n%s", status, body)
	}
	sum := md5.Sum([]byte("{}\n"))
	if created.ETag != `"`+hex.EncodeToString(sum[:])+`"` {
		t.Fatalf("ETag %s, want the MD5 of the content", created.ETag)
	}
	// The string-valued content-length-range holds too.
	status, body = upload(t, url, signed, bytes.Repeat([]byte("x"), 101))
	wantS3Error(t, status, body, 400, "EntityTooLarge")
}

// signPolicy signs a hand-written policy with the store's secret, as the
// gateway would: %CRED% in it becomes the credential.
func signPolicy(t *testing.T, l *Local, policy string) map[string]string {
	t.Helper()
	now := time.Now().UTC()
	c := l.cred
	c.date = now.Format(scopeDateFormat)
	policy = strings.ReplaceAll(policy, "%CRED%", c.String())
	b64 := base64.StdEncoding.EncodeToString([]byte(policy))
	return map[string]string{
		"policy":           b64,
		"x-amz-algorithm":  sigAlgorithm,
		"x-amz-credential": c.String(),
		"x-amz-date":       now.Format(amzDateFormat),
		"x-amz-signature":  policySignature(l.secret, c, b64),
	}
}

// TestLocalChecksEveryCondition: signed but unfit policies are refused
// with S3's codes, each for its own reason.
func TestLocalChecksEveryCondition(t *testing.T) {
	l, _, _ := startLocal(t, LocalOptions{})
	url := l.bucketURL()
	exp := `"expiration":"` + time.Now().Add(time.Hour).UTC().Format(policyTimeFormat) + `"`
	base := `{"bucket":"tollgate"},["eq","$key","k"],{"x-amz-algorithm":"AWS4-HMAC-SHA256"},{"x-amz-credential":"%CRED%"},["starts-with","$x-amz-date",""]`
	for _, tc := range []struct {
		name, policy, code string
		status             int
	}{
		{"OtherBucket", `{` + exp + `,"conditions":[{"bucket":"other"},["eq","$key","k"],{"x-amz-algorithm":"AWS4-HMAC-SHA256"},{"x-amz-credential":"%CRED%"},["starts-with","$x-amz-date",""]]}`, "AccessDenied", 403},
		{"KeyPrefix", `{` + exp + `,"conditions":[{"bucket":"tollgate"},["starts-with","$key","batch/"],{"x-amz-algorithm":"AWS4-HMAC-SHA256"},{"x-amz-credential":"%CRED%"},["starts-with","$x-amz-date",""]]}`, "AccessDenied", 403},
		{"DateNotInPolicy", `{` + exp + `,"conditions":[{"bucket":"tollgate"},["eq","$key","k"],{"x-amz-algorithm":"AWS4-HMAC-SHA256"},{"x-amz-credential":"%CRED%"}]}`, "AccessDenied", 403},
		{"CredentialMismatch", `{` + exp + `,"conditions":[{"bucket":"tollgate"},["eq","$key","k"],{"x-amz-algorithm":"AWS4-HMAC-SHA256"},{"x-amz-credential":"someone-else"},["starts-with","$x-amz-date",""]]}`, "AccessDenied", 403},
		{"NoExpiration", `{"conditions":[` + base + `]}`, "InvalidPolicyDocument", 400},
		{"BadExpiration", `{"expiration":"tomorrow","conditions":[` + base + `]}`, "InvalidPolicyDocument", 400},
		{"NotJSON", `expiration: soon`, "InvalidPolicyDocument", 400},
		{"UnknownOperator", `{` + exp + `,"conditions":[` + base + `,["ends-with","$key","k"]]}`, "InvalidPolicyDocument", 400},
		{"InvertedRange", `{` + exp + `,"conditions":[` + base + `,["content-length-range",10,1]]}`, "InvalidPolicyDocument", 400},
		{"TooSmall", `{` + exp + `,"conditions":[` + base + `,["content-length-range",100,200]]}`, "EntityTooSmall", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fields := signPolicy(t, l, tc.policy)
			fields["key"] = "k"
			status, body := upload(t, url, fields, []byte("{}\n"))
			wantS3Error(t, status, body, tc.status, tc.code)
			wantNotExist(t, l, "k")
		})
	}
	// The same policy accepted, so the refusals above are for their reasons.
	fields := signPolicy(t, l, `{`+exp+`,"conditions":[`+base+`]}`)
	fields["key"] = "k"
	if status, body := upload(t, url, fields, []byte("{}\n")); status != http.StatusNoContent {
		t.Fatalf("the base policy: %d\n%s", status, body)
	}
	// Requests that are not uploads or downloads.
	for _, tc := range []struct {
		method, path, code string
		status             int
	}{
		{"POST", "/other", "NoSuchBucket", 404},
		{"PUT", "/tollgate/k", "MethodNotAllowed", 405},
		{"GET", "/tollgate", "MethodNotAllowed", 405},
		{"GET", "/tollgate/k", "AccessDenied", 403},
	} {
		req, _ := http.NewRequest(tc.method, strings.TrimSuffix(url, "/tollgate")+tc.path, strings.NewReader("x"))
		status, body := do(t, req)
		wantS3Error(t, status, body, tc.status, tc.code)
	}
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"not":"a form"}`))
	req.Header.Set("Content-Type", "application/json")
	status, body := do(t, req)
	wantS3Error(t, status, body, 412, "PreconditionFailed")
}

// TestLocalSecretIsGeneratedOnceAndKept: the first start writes a private
// secret; a restart reads it, so URLs presigned before keep working.
func TestLocalSecretIsGeneratedOnceAndKept(t *testing.T) {
	dir := t.TempDir()
	first, _, _ := startLocal(t, LocalOptions{DataDir: dir})
	fi, err := os.Stat(filepath.Join(dir, SecretFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", SecretFile, fi.Mode().Perm())
	}
	if len(first.secret) < 32 {
		t.Fatalf("secret %q is too short", first.secret)
	}
	key := "batch/acct-1/job-7/input.ndjson"
	_, fields, err := first.PresignPost(context.Background(), key, 1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	second, _, _ := startLocal(t, LocalOptions{DataDir: dir})
	if second.secret != first.secret {
		t.Fatal("a second start generated a new secret")
	}
	if status, body := upload(t, second.bucketURL(), fields, ndjson(2)); status != http.StatusNoContent {
		t.Fatalf("a form presigned before the restart: %d\n%s", status, body)
	}
	other, _, _ := startLocal(t, LocalOptions{})
	status, body := upload(t, other.bucketURL(), fields, ndjson(2))
	wantS3Error(t, status, body, 403, "SignatureDoesNotMatch")
}

func TestLoadOrCreateSecretRace(t *testing.T) {
	file := filepath.Join(t.TempDir(), "data", SecretFile)
	secrets := make(chan string, 8)
	for range cap(secrets) {
		go func() {
			s, err := LoadOrCreateSecret(file)
			if err != nil {
				t.Error(err)
			}
			secrets <- s
		}()
	}
	first := <-secrets
	for range cap(secrets) - 1 {
		if s := <-secrets; s != first || s == "" {
			t.Fatalf("concurrent starts got secrets %q and %q", first, s)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".storage.secret-*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// TestLocalBehindAReverseProxy: presigned URLs name the public base URL,
// here a proxy that publishes the endpoint under /files and rewrites Host.
func TestLocalBehindAReverseProxy(t *testing.T) {
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, _, addr := startLocal(t, LocalOptions{PublicBaseURL: "http://" + proxyLn.Addr().String() + "/files/"})
	target, _ := url.Parse("http://" + addr)
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.URL.Path = strings.TrimPrefix(r.In.URL.Path, "/files")
		r.Out.URL.RawPath = ""
	}}
	srv := &http.Server{Handler: proxy}
	go srv.Serve(proxyLn) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })

	ctx := context.Background()
	key := "batch/acct-1/job-8/input.ndjson"
	up, fields, err := l.PresignPost(ctx, key, 1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(up, "http://"+proxyLn.Addr().String()+"/files/tollgate") {
		t.Fatalf("upload URL %s is not under the public base URL", up)
	}
	content := ndjson(20)
	if status, body := upload(t, up, fields, content); status != http.StatusNoContent {
		t.Fatalf("upload through the proxy: %d\n%s", status, body)
	}
	down, _, err := l.PresignGet(ctx, key, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := get(t, down); status != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("download through the proxy: %d\n%s", status, body)
	}
	// Straight to the listener, prefix and all, works as well.
	direct := strings.Replace(down, proxyLn.Addr().String(), addr, 1)
	if status, body := get(t, direct); status != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("download with the prefix, not through the proxy: %d\n%s", status, body)
	}
}

// TestLocalUploadWithCurl is the upload as the spec's readers would type
// it: curl -F, every field, then the file.
func TestLocalUploadWithCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatal("curl is not installed (apt-get install curl): this test uploads exactly as the README tells users to")
	}
	l, _, _ := startLocal(t, LocalOptions{})
	ctx := context.Background()
	key := "batch/acct-1/job-9/input.ndjson"
	url, fields, err := l.PresignPost(ctx, key, 4<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "input.ndjson")
	content := ndjson(100_000) // over 1MiB: curl sends Expect: 100-continue
	if err := os.WriteFile(file, content, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-sS", "-o", "/dev/null", "-w", "%{http_code}"}
	for _, name := range sortedKeys(fields) {
		args = append(args, "--form-string", name+"="+fields[name])
	}
	args = append(args, "-F", "file=@"+file, url)
	out, err := exec.Command(curl, args...).CombinedOutput()
	if err != nil || string(out) != "204" {
		t.Fatalf("curl: %v, %s", err, out)
	}
	if got := readAll(t)(l.Open(ctx, key)); got != string(content) {
		t.Fatalf("stored %d bytes, curl sent %d", len(got), len(content))
	}
}

// TestLocalUploadOf200MBStreamsToDisk: the gateway's heap grows by a few
// buffers, not by the file, and the bytes on disk are the bytes sent.
func TestLocalUploadOf200MBStreamsToDisk(t *testing.T) {
	const size = 200 << 20
	l, _, _ := startLocal(t, LocalOptions{})
	ctx := context.Background()
	key := "batch/acct-1/job-10/input.ndjson"
	url, fields, err := l.PresignPost(ctx, key, size, time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	src := &lineSource{remaining: size, sum: md5.New()}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() { pw.CloseWithError(writeForm(mw, fields, src, nil)) }()
	req, _ := http.NewRequest(http.MethodPost, url, pr)
	req.Header.Set("Content-Type", mw.FormDataContentType())

	runtime.GC()
	baseline := heapInuse()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapInuse(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	began := time.Now()
	resp, err := http.DefaultClient.Do(req)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("upload: %s", resp.Status)
	}
	growth := int64(peak.Load()) - int64(baseline)
	t.Logf("200MB upload in %v; heap in use grew by at most %.1f MiB", time.Since(began).Round(time.Millisecond), float64(growth)/(1<<20))
	// A buffered upload holds all 200 MiB; a streamed one a few buffers.
	// The bound leaves room for what other goroutines of the test process
	// allocate meanwhile: under a loaded make test, 35 MiB was seen once.
	if growth > 100<<20 {
		t.Fatalf("heap in use grew by %d MiB while uploading 200 MiB: the upload is buffered, not streamed", growth>>20)
	}
	if got := resp.Header.Get("ETag"); got != `"`+hex.EncodeToString(src.sum.Sum(nil))+`"` {
		t.Fatalf("ETag %s is not the MD5 of what was sent", got)
	}
	if info, err := l.Stat(ctx, key); err != nil || info.Size != size {
		t.Fatalf("Stat = %+v, %v; want %d", info, err, size)
	}
}

func heapInuse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// lineSource produces NDJSON lines up to remaining bytes, hashing them.
type lineSource struct {
	remaining int64
	sum       hash.Hash
	n         int
}

func (s *lineSource) Read(p []byte) (int, error) {
	if s.remaining == 0 {
		return 0, io.EOF
	}
	w := 0
	for w < len(p) && s.remaining > 0 {
		line := `{"text":"line ` + strings.Repeat("y", s.n%50) + "\"}\n"
		s.n++
		c := copy(p[w:min(len(p), w+int(min(int64(len(line)), s.remaining)))], line)
		w += c
		s.remaining -= int64(c)
	}
	s.sum.Write(p[:w])
	return w, nil
}

// TestLocalUploadCutMidway: a client that goes away in the middle of the
// file leaves no object and no partial file behind.
func TestLocalUploadCutMidway(t *testing.T) {
	b, l := localBackend(t)
	key := "batch/acct-1/job-11/input.ndjson"
	url, fields, err := l.PresignPost(context.Background(), key, 1<<30, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn := startRawUpload(t, l, url, fields, ndjson(100_000), 2)
	// The partial file exists while the upload runs, then goes.
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if left := b.leftovers(t); len(left) == 0 {
			return errors.New("no partial file while uploading")
		}
		return nil
	})
	conn.Close()
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if left := b.leftovers(t); len(left) != 0 {
			return fmt.Errorf("a cut upload left %v", left)
		}
		return nil
	})
	wantNotExist(t, l, key)
}

// TestLocalStalledUploadIsCut: a client that stops sending in the middle
// of the file is cut after the idle timeout, and nothing is left behind.
func TestLocalStalledUploadIsCut(t *testing.T) {
	b, l := localBackend(t)
	l.idleTimeout = 300 * time.Millisecond
	key := "batch/acct-1/job-12/input.ndjson"
	url, fields, err := l.PresignPost(context.Background(), key, 1<<30, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	conn := startRawUpload(t, l, url, fields, ndjson(1000), 2)
	defer conn.Close()
	// ... and nothing more: the server answers and hangs up.
	began := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, _ := io.ReadAll(conn)
	if waited := time.Since(began); waited > 3*time.Second || !bytes.Contains(answer, []byte("IncompleteBody")) {
		t.Fatalf("after %v the stalled upload got %q, want IncompleteBody after about %v", waited, answer, l.idleTimeout)
	}
	if left := b.leftovers(t); len(left) != 0 {
		t.Fatalf("a stalled upload left %v", left)
	}
	wantNotExist(t, l, key)
}

// startRawUpload sends the head of an upload and the first 1/part of its
// body over a connection of its own, which it returns.
func startRawUpload(t *testing.T, l *Local, url string, fields map[string]string, file []byte, part int) net.Conn {
	t.Helper()
	body, contentType := multipartBody(t, fields, file, nil)
	conn, err := net.Dial("tcp", l.base.Host)
	if err != nil {
		t.Fatal(err)
	}
	head := "POST " + strings.TrimPrefix(url, l.base.String()) + " HTTP/1.1\r\nHost: " + l.base.Host +
		"\r\nContent-Type: " + contentType + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	if _, err := conn.Write(append([]byte(head), body[:len(body)/part]...)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// A refused request's path is logged quoted: decoded, a %0a in it once
// wrote a line of the attacker's choosing into the gateway's log.
func TestRefusedRequestCannotForgeLogLines(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	_, _, addr := startLocal(t, LocalOptions{Logf: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(format, args...))
	}})
	resp, err := http.Get("http://" + addr + "/tollgate/x%0a2026/11/26%2003:11:30%20billing:%20FAKE?X-Amz-Signature=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(lines) == 0 {
		t.Fatal("the refused request was not logged")
	}
	for _, l := range lines {
		if strings.Contains(l, "\n") {
			t.Errorf("a log line holds a newline: %q", l)
		}
	}
}

// Refusals such as SignatureDoesNotMatch were one shared value whose
// RequestId each request overwrote: concurrent refusals raced, and a body
// could name another request's id than its header.
func TestConcurrentRefusalsNameTheirOwnRequestID(t *testing.T) {
	l, _, _ := startLocal(t, LocalOptions{Logf: func(string, ...any) {}})
	signed, _, err := l.PresignGet(context.Background(), "k", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forged := signed[:len(signed)-4] + "0000"
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				resp, err := http.Get(forged)
				if err != nil {
					t.Error(err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var e struct{ Code, RequestId string }
				if err := xml.Unmarshal(body, &e); err != nil || e.Code != "SignatureDoesNotMatch" {
					t.Errorf("%d %s: want SignatureDoesNotMatch", resp.StatusCode, body)
					return
				}
				if h := resp.Header.Get("x-amz-request-id"); e.RequestId != h {
					t.Errorf("the body names request %s, its header %s", e.RequestId, h)
					return
				}
			}
		}()
	}
	wg.Wait()
}
