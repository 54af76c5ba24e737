package storage

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/internal/durable"
)

// Defaults of the local backend.
const (
	// LocalBucket is the bucket name the local backend serves and signs for.
	LocalBucket = "tollgate"
	// LocalAccessKey is the access key of the local backend's credential;
	// only the secret in <data_dir>/storage.secret is secret.
	LocalAccessKey = "tollgate-local"
	// LocalRegion is the region in the local backend's credential scope.
	LocalRegion = "us-east-1"
	// SecretFile is the name, in the data directory, of the local backend's
	// secret key, generated on first start.
	SecretFile = "storage.secret"
)

// LocalOptions configures NewLocal.
type LocalOptions struct {
	// DataDir holds objects/ (the bucket's files and partial uploads) and
	// storage.secret.
	DataDir string
	// PublicBaseURL is the address clients reach the Handler at, such as
	// http://127.0.0.1:8081; presigned URLs start with it. A path in it is
	// a prefix a reverse proxy may or may not strip: both are served.
	PublicBaseURL string
	// SecretKey signs and verifies presigned requests; empty: read from
	// <DataDir>/storage.secret, generated there on first start.
	SecretKey string
	// Logf receives refused uploads and I/O faults; nil discards them.
	Logf func(format string, args ...any)
}

// Local is the embedded backend: objects are files under
// <data_dir>/objects/<bucket>/<key>, and Handler is an S3-compatible
// endpoint for presigned browser uploads and downloads. Serve it on a
// listener of its own (see Serve): an upload streams up to 5GiB to disk.
type Local struct {
	root       string // <data_dir>/objects
	partialDir string // uploads in progress, renamed into place on commit
	secret     string
	cred       credential // date filled in per signature
	base       *url.URL
	logf       func(string, ...any)
	http       *http.Server
	// idleTimeout is defaultIdleTimeout; tests shorten it.
	idleTimeout time.Duration
}

// NewLocal opens (creating when missing) the object directory under
// opts.DataDir. Partial uploads left by an earlier process are removed.
func NewLocal(opts LocalOptions) (*Local, error) {
	base, err := url.Parse(strings.TrimRight(opts.PublicBaseURL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" || base.RawQuery != "" {
		return nil, fmt.Errorf("storage: public base URL %q: want an absolute http(s) URL such as http://127.0.0.1:8081", opts.PublicBaseURL)
	}
	secret := opts.SecretKey
	if secret == "" {
		secret, err = LoadOrCreateSecret(filepath.Join(opts.DataDir, SecretFile))
		if err != nil {
			return nil, err
		}
	}
	l := &Local{
		root:   filepath.Join(opts.DataDir, "objects"),
		secret: secret,
		cred:   credential{accessKey: LocalAccessKey, region: LocalRegion},
		base:   base,
		logf:   opts.Logf,

		idleTimeout: defaultIdleTimeout,
	}
	if l.logf == nil {
		l.logf = func(string, ...any) {}
	}
	l.http = &http.Server{
		Handler:           l.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(logWriter(l.logf), "storage: ", 0),
	}
	// ".partial" is no valid bucket name, so it never meets a bucket's files.
	l.partialDir = filepath.Join(l.root, ".partial")
	if err := os.RemoveAll(l.partialDir); err != nil {
		return nil, fmt.Errorf("storage: removing partial uploads: %w", err)
	}
	for _, dir := range []string{l.partialDir, filepath.Join(l.root, LocalBucket)} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("storage: creating %s: %w", dir, err)
		}
	}
	return l, nil
}

// LoadOrCreateSecret reads the secret key in file, or writes a new random
// one there (mode 0600) when the file does not exist.
func LoadOrCreateSecret(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err == nil {
		secret := strings.TrimSpace(string(data))
		if secret == "" {
			return "", fmt.Errorf("storage: %s is empty: delete it to have a new secret generated", file)
		}
		return secret, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("storage: reading secret: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("storage: generating secret: %w", err)
	}
	secret := hex.EncodeToString(raw)
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return "", fmt.Errorf("storage: creating data directory: %w", err)
	}
	// Of two processes starting at once, one creates it and the other
	// reads the whole secret it wrote. The directory's sync matters: a
	// power loss soon after a first start lost the secret, and the upload
	// and download URLs handed out before it were refused after.
	created, err := durable.CreateFile(file, []byte(secret+"\n"))
	if err != nil {
		return "", fmt.Errorf("storage: writing secret: %w", err)
	}
	if !created {
		return LoadOrCreateSecret(file)
	}
	return secret, nil
}

// Serve runs the upload and download endpoint on ln until Shutdown. Unlike
// the API listener it has no total read timeout, which would cut a large
// upload; a connection idle for a minute in the middle of a body is cut
// instead.
func (l *Local) Serve(ln net.Listener) error {
	err := l.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops Serve, waiting for transfers in progress until ctx ends.
func (l *Local) Shutdown(ctx context.Context) error {
	return l.http.Shutdown(ctx)
}

// objectPath is where key lives on disk.
func (l *Local) objectPath(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(l.root, LocalBucket, filepath.FromSlash(key)), nil
}

// PresignPost implements Store: the policy pins the bucket and the key,
// limits the size to 1..maxBytes and names every other field sent.
func (l *Local) PresignPost(_ context.Context, key string, maxBytes int64, ttl time.Duration) (string, map[string]string, error) {
	if err := checkPresign(key, maxBytes, ttl); err != nil {
		return "", nil, err
	}
	return l.presignPost(key, maxBytes, time.Now(), ttl)
}

func (l *Local) presignPost(key string, maxBytes int64, now time.Time, ttl time.Duration) (string, map[string]string, error) {
	fields, err := signPost(l.secret, l.cred, LocalBucket, key, maxBytes, now, ttl)
	return l.bucketURL(), fields, err
}

// signPost returns the form fields of an upload of key into bucket, signed
// at now for ttl with the access key and region of c.
func signPost(secret string, c credential, bucket, key string, maxBytes int64, now time.Time, ttl time.Duration) (map[string]string, error) {
	c.date = now.UTC().Format(scopeDateFormat)
	amzDate := now.UTC().Format(amzDateFormat)
	policy, err := json.Marshal(map[string]any{
		"expiration": now.Add(ttl).UTC().Format(policyTimeFormat),
		"conditions": []any{
			map[string]string{"bucket": bucket},
			[]any{"eq", "$key", key},
			[]any{"content-length-range", 1, maxBytes},
			map[string]string{"x-amz-algorithm": sigAlgorithm},
			map[string]string{"x-amz-credential": c.String()},
			map[string]string{"x-amz-date": amzDate},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("storage: encoding policy: %w", err)
	}
	policyB64 := base64.StdEncoding.EncodeToString(policy)
	return map[string]string{
		"key":              key,
		"policy":           policyB64,
		"x-amz-algorithm":  sigAlgorithm,
		"x-amz-credential": c.String(),
		"x-amz-date":       amzDate,
		"x-amz-signature":  policySignature(secret, c, policyB64),
	}, nil
}

// policyTimeFormat is how S3 writes a policy's expiration.
const policyTimeFormat = "2006-01-02T15:04:05.000Z"

func (l *Local) bucketURL() string {
	return l.base.String() + "/" + LocalBucket
}

// objectURLPath is the decoded path of key's URL, the base URL's path
// included: the path a presigned GET signs.
func (l *Local) objectURLPath(key string) string {
	return path.Join("/", l.base.Path, LocalBucket) + "/" + key
}

// PresignGet implements Store.
func (l *Local) PresignGet(_ context.Context, key string, ttl time.Duration) (string, time.Time, error) {
	if err := CheckKey(key); err != nil {
		return "", time.Time{}, err
	}
	if err := checkTTL(ttl); err != nil {
		return "", time.Time{}, err
	}
	now := time.Now()
	return l.presignGet(key, now, ttl), linkExpiry(now, ttl), nil
}

func (l *Local) presignGet(key string, now time.Time, ttl time.Duration) string {
	c := l.cred
	c.date = now.UTC().Format(scopeDateFormat)
	p := l.objectURLPath(key)
	return l.base.Scheme + "://" + l.base.Host + uriEncode(p, true) + "?" + presignQuery(l.secret, c, l.base.Host, p, now, ttl)
}

// Stat implements Store.
func (l *Local) Stat(_ context.Context, key string) (Info, error) {
	p, err := l.objectPath(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return Info{}, notExist(key, err)
	}
	return Info{Size: fi.Size(), Version: fileVersion(fi)}, nil
}

// notExist maps a failed lookup of key: a missing file, or a directory
// where a file was expected, is ErrNotExist.
func notExist(key string, err error) error {
	if err == nil || errors.Is(err, fs.ErrNotExist) || isNotDir(err) {
		return fmt.Errorf("%w: %s", ErrNotExist, key)
	}
	return fmt.Errorf("storage: %s: %w", key, err)
}

// Open implements Store.
func (l *Local) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	return l.OpenAt(ctx, key, 0)
}

// OpenAt implements Store.
func (l *Local) OpenAt(_ context.Context, key string, offset int64) (io.ReadCloser, error) {
	f, size, err := l.openFile(key)
	if err != nil {
		return nil, err
	}
	if offset < 0 || offset > size {
		f.Close()
		return nil, fmt.Errorf("storage: offset %d is outside %s (%d bytes)", offset, key, size)
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("storage: %s: %w", key, err)
	}
	return f, nil
}

func (l *Local) openFile(key string) (*os.File, int64, error) {
	p, err := l.objectPath(key)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, 0, notExist(key, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, notExist(key, err)
	}
	return f, fi.Size(), nil
}

// Create implements Store: the object is written to a partial file, which
// Commit syncs and renames into place.
func (l *Local) Create(_ context.Context, key string) (Upload, error) {
	p, err := l.objectPath(key)
	if err != nil {
		return nil, err
	}
	return l.newPartial(key, p)
}

func (l *Local) newPartial(key, final string) (*partialFile, error) {
	f, err := os.CreateTemp(l.partialDir, "upload-*")
	if err != nil {
		return nil, fmt.Errorf("storage: creating %s: %w", key, err)
	}
	return &partialFile{f: f, key: key, final: final, bucketDir: filepath.Join(l.root, LocalBucket)}, nil
}

// Delete implements Store. Directories the key leaves empty go too, so a
// deleted job leaves nothing behind.
func (l *Local) Delete(_ context.Context, key string) error {
	p, err := l.objectPath(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !isNotDir(err) {
		return fmt.Errorf("storage: deleting %s: %w", key, err)
	}
	bucketDir := filepath.Join(l.root, LocalBucket)
	for dir := filepath.Dir(p); dir != bucketDir && strings.HasPrefix(dir, bucketDir); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break // not empty, or already gone
		}
	}
	return nil
}

// partialFile is an Upload of the local backend.
type partialFile struct {
	f         *os.File
	key       string
	final     string
	bucketDir string
	done      bool
}

func (u *partialFile) Write(p []byte) (int, error) {
	if u.done {
		return 0, fmt.Errorf("storage: write to %s after Commit or Abort", u.key)
	}
	return u.f.Write(p)
}

// Commit syncs the file, renames it into place and syncs the directory, so
// a committed object survives a crash.
func (u *partialFile) Commit() error {
	if u.done {
		return fmt.Errorf("storage: %s committed or aborted already", u.key)
	}
	u.done = true
	err := u.f.Sync()
	if cerr := u.f.Close(); err == nil {
		err = cerr
	}
	dir := filepath.Dir(u.final)
	if err == nil {
		err = os.MkdirAll(dir, 0o750)
	}
	if err == nil {
		err = os.Rename(u.f.Name(), u.final)
	}
	if err != nil {
		_ = os.Remove(u.f.Name())
		return fmt.Errorf("storage: committing %s: %w", u.key, err)
	}
	if err := durable.SyncDir(dir); err != nil {
		return fmt.Errorf("storage: committing %s: %w", u.key, err)
	}
	return nil
}

func (u *partialFile) Abort() {
	if u.done {
		return
	}
	u.done = true
	u.f.Close()
	_ = os.Remove(u.f.Name())
}

// isNotDir reports ENOTDIR: a path through a file, as when key a/b is
// looked up while a is an object.
func isNotDir(err error) bool {
	return errors.Is(err, syscall.ENOTDIR)
}

// logWriter turns net/http's log lines (a broken TLS handshake, a panic in
// a handler) into Logf calls.
type logWriter func(string, ...any)

func (w logWriter) Write(p []byte) (int, error) {
	w("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
