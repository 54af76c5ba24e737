package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/tollgate/tollgate/internal/loglimit"
)

// S3Options configures NewS3.
type S3Options struct {
	// Endpoint is host[:port]; UseSSL selects https.
	Endpoint  string
	UseSSL    bool
	Region    string // default us-east-1
	Bucket    string
	AccessKey string
	SecretKey string
	// PublicEndpoint is the http(s) URL clients reach the store at, for
	// presigned URLs; empty: Endpoint.
	PublicEndpoint string
	// CreateBucket creates Bucket when it does not exist.
	CreateBucket bool
	// Logf says when the store did not answer at start, and when it
	// does; nil: not said.
	Logf func(string, ...any)
}

// s3PartSize is the part size of streamed writes: minio-go buffers one part
// in memory, and 10,000 parts of 16MiB allow objects of 156GiB.
const s3PartSize = 16 << 20

// S3 is the backend for any S3-compatible store.
type S3 struct {
	client *minio.Client
	// presigner signs URLs for the public endpoint. It never connects:
	// its region is set, so minio-go need not look the bucket's up.
	presigner *minio.Client
	bucket    string
	// unchecked is why the bucket is not known to be there yet: the
	// store did not answer at start, and is asked again in the
	// background. Until it answers every method returns this error,
	// which batch jobs take for an outage. nil once it answered.
	unchecked atomic.Pointer[error]
}

const (
	// bucketCheckTimeout bounds one check of the bucket: minio-go tries
	// a refused connection 10 times over about 3 s, but a store that
	// drops packets would hold each try for its dial timeout.
	bucketCheckTimeout = 10 * time.Second
	// bucketRetryPause is the pause between checks of a store that did
	// not answer at start: short, so batch jobs go on within seconds of
	// its return.
	bucketRetryPause = time.Second
	// bucketLogEvery is how often a store that still does not answer
	// is logged again.
	bucketLogEvery = 30 * time.Second
)

// NewS3 connects to the store and checks that the bucket is there (creating
// it when opts.CreateBucket), so a wrong key or bucket fails at start
// rather than at the first upload. A store that does not answer (no
// connection, a timeout, a 5xx) is an outage, not a mistake: the
// gateway's API must not wait for it. NewS3 then returns the store, whose
// methods fail until a check made in the background, every second until
// ctx ends, finds the bucket (making it if asked).
func NewS3(ctx context.Context, opts S3Options) (*S3, error) {
	if opts.Region == "" {
		opts.Region = "us-east-1"
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	creds := credentials.NewStaticV4(opts.AccessKey, opts.SecretKey, "")
	client, err := minio.New(opts.Endpoint, &minio.Options{Creds: creds, Secure: opts.UseSSL, Region: opts.Region})
	if err != nil {
		return nil, fmt.Errorf("storage: s3 endpoint %q: %w", opts.Endpoint, err)
	}
	s := &S3{client: client, presigner: client, bucket: opts.Bucket}
	if opts.PublicEndpoint != "" {
		u, err := url.Parse(opts.PublicEndpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("storage: s3 public endpoint %q: want an http(s) URL such as https://files.example.com", opts.PublicEndpoint)
		}
		s.presigner, err = minio.New(u.Host, &minio.Options{Creds: creds, Secure: u.Scheme == "https", Region: opts.Region})
		if err != nil {
			return nil, fmt.Errorf("storage: s3 public endpoint %q: %w", opts.PublicEndpoint, err)
		}
	}
	began := time.Now()
	err = s.checkBucket(ctx, opts)
	if err == nil {
		return s, nil
	}
	if ctx.Err() != nil || !storeDown(ctx, err) {
		return nil, err
	}
	opts.Logf("%v; starting without it: batch calls that need it answer 503 batch_unavailable and jobs wait, "+
		"until it answers (asked every %s, logged every %s)", err, bucketRetryPause, bucketLogEvery)
	s.unchecked.Store(&err)
	go s.awaitBucket(ctx, opts, began)
	return s, nil
}

// checkBucket checks that the bucket is there, making it when
// opts.CreateBucket.
func (s *S3) checkBucket(ctx context.Context, opts S3Options) error {
	ctx, cancel := context.WithTimeout(ctx, bucketCheckTimeout)
	defer cancel()
	exists, err := s.client.BucketExists(ctx, opts.Bucket)
	if err != nil {
		return fmt.Errorf("storage: s3 bucket %s at %s: %w", opts.Bucket, opts.Endpoint, err)
	}
	if !exists {
		if !opts.CreateBucket {
			return fmt.Errorf("storage: s3 bucket %s does not exist at %s: create it, or set storage.s3.create_bucket", opts.Bucket, opts.Endpoint)
		}
		err := s.client.MakeBucket(ctx, opts.Bucket, minio.MakeBucketOptions{Region: opts.Region})
		if err != nil && !isCode(err, "BucketAlreadyOwnedByYou") {
			return fmt.Errorf("storage: creating s3 bucket %s at %s: %w", opts.Bucket, opts.Endpoint, err)
		}
	}
	return nil
}

// awaitBucket checks the bucket of a store that did not answer at start
// until it is there or ctx ends. An answer that is no outage (a key
// refused, a missing bucket) is logged at once, since only the operator
// can end it, and the checks go on.
func (s *S3) awaitBucket(ctx context.Context, opts S3Options, began time.Time) {
	// Its state is whether the store was down; NewS3 logged the first.
	var failLog loglimit.Limiter
	failLog.AllowChanged(time.Now(), bucketLogEvery, 0, strconv.FormatBool(true))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(bucketRetryPause):
		}
		err := s.checkBucket(ctx, opts)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			s.unchecked.Store(nil)
			opts.Logf("storage: s3 bucket %s at %s answers now, %s after the start: batch jobs go on",
				opts.Bucket, opts.Endpoint, time.Since(began).Round(time.Second))
			return
		}
		s.unchecked.Store(&err)
		if ok, _ := failLog.AllowChanged(time.Now(), bucketLogEvery, 0, strconv.FormatBool(storeDown(ctx, err))); ok {
			opts.Logf("%v; batch jobs still wait for it (%s since the start)", err, time.Since(began).Round(time.Second))
		}
	}
}

// storeDown says err is the store not answering, or answering that it
// cannot now (a 5xx: MinIO starting, a proxy without a backend), which an
// outage explains. A 4xx (a key refused) or a certificate refused is a
// mistake to fix, as is anything not said over the network.
func storeDown(ctx context.Context, err error) bool {
	if code := minio.ToErrorResponse(err).StatusCode; code != 0 {
		return code >= 500
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case errors.As(err, &opErr), errors.As(err, &dnsErr):
		return true // refused, reset, unreachable; a name not (yet) in DNS
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true // the connection closed before an answer
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return true // bucketCheckTimeout
	case errors.As(err, &netErr) && netErr.Timeout():
		return true
	}
	return false
}

// notChecked is the error of every method until the bucket was found.
func (s *S3) notChecked() error {
	if err := s.unchecked.Load(); err != nil {
		return fmt.Errorf("%w (the bucket is not checked yet: asked again every %s)", *err, bucketRetryPause)
	}
	return nil
}

// PresignPost implements Store.
func (s *S3) PresignPost(ctx context.Context, key string, maxBytes int64, ttl time.Duration) (string, map[string]string, error) {
	if err := checkPresign(key, maxBytes, ttl); err != nil {
		return "", nil, err
	}
	// Presigning asks nothing of the store, but a form for a store not
	// checked yet may name a bucket still to be made.
	if err := s.notChecked(); err != nil {
		return "", nil, err
	}
	p := minio.NewPostPolicy()
	for _, err := range []error{
		p.SetBucket(s.bucket),
		p.SetKey(key),
		p.SetExpires(time.Now().UTC().Add(ttl)),
		p.SetContentLengthRange(1, maxBytes),
	} {
		if err != nil {
			return "", nil, fmt.Errorf("storage: post policy for %s: %w", key, err)
		}
	}
	u, fields, err := s.presigner.PresignedPostPolicy(ctx, p)
	if err != nil {
		return "", nil, fmt.Errorf("storage: presigning upload of %s: %w", key, err)
	}
	return u.String(), fields, nil
}

// PresignGet implements Store.
func (s *S3) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, time.Time, error) {
	if err := CheckKey(key); err != nil {
		return "", time.Time{}, err
	}
	if err := checkTTL(ttl); err != nil {
		return "", time.Time{}, err
	}
	if err := s.notChecked(); err != nil {
		return "", time.Time{}, err
	}
	// minio-go reads the clock itself, after this.
	signedAt := time.Now()
	u, err := s.presigner.PresignedGetObject(ctx, s.bucket, key, ttl, nil)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("storage: presigning download of %s: %w", key, err)
	}
	return u.String(), linkExpiry(signedAt, ttl), nil
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := CheckKey(key); err != nil {
		return Info{}, err
	}
	if err := s.notChecked(); err != nil {
		return Info{}, err
	}
	info, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.mapError(key, err)
	}
	return Info{Size: info.Size, Version: info.ETag}, nil
}

// Open implements Store.
func (s *S3) Open(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.OpenAt(ctx, key, 0)
}

// OpenAt implements Store with a ranged GET.
func (s *S3) OpenAt(ctx context.Context, key string, offset int64) (io.ReadCloser, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, fmt.Errorf("storage: negative offset %d in %s", offset, key)
	}
	if err := s.notChecked(); err != nil {
		return nil, err
	}
	var opts minio.GetObjectOptions
	if offset > 0 {
		if err := opts.SetRange(offset, 0); err != nil {
			return nil, fmt.Errorf("storage: %s: %w", key, err)
		}
	}
	obj, err := s.client.GetObject(ctx, s.bucket, key, opts)
	if err != nil {
		return nil, s.mapError(key, err)
	}
	// GetObject is lazy: Stat sends the request, so a missing object is
	// reported here and not at the first Read.
	if _, err := obj.Stat(); err != nil {
		obj.Close()
		if offset > 0 && isCode(err, "InvalidRange") {
			info, serr := s.Stat(ctx, key)
			switch {
			case serr != nil:
				return nil, serr
			case offset == info.Size:
				return emptyReader{}, nil
			default:
				return nil, fmt.Errorf("storage: offset %d is outside %s (%d bytes)", offset, key, info.Size)
			}
		}
		return nil, s.mapError(key, err)
	}
	return obj, nil
}

// Create implements Store: the object streams through a pipe into a
// multipart upload, one part in memory at a time. The store publishes it
// only when the upload completes at Commit; Abort cancels it.
func (s *S3) Create(ctx context.Context, key string) (Upload, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	if err := s.notChecked(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	u := &s3Upload{key: key, pw: pw, cancel: cancel, done: make(chan error, 1)}
	go func() {
		_, err := s.client.PutObject(ctx, s.bucket, key, pr, -1, minio.PutObjectOptions{
			PartSize:    s3PartSize,
			ContentType: "application/octet-stream",
		})
		// Unblocks a Write waiting on a store that failed.
		pr.CloseWithError(fmt.Errorf("storage: writing %s: %w", key, errOrClosed(err)))
		u.done <- err
	}()
	return u, nil
}

func errOrClosed(err error) error {
	if err == nil {
		return io.ErrClosedPipe
	}
	return err
}

// errAborted ends the pipe of an aborted upload, so PutObject fails and
// abandons the multipart upload instead of completing it.
var errAborted = errors.New("storage: upload aborted")

type s3Upload struct {
	key      string
	pw       *io.PipeWriter
	cancel   context.CancelFunc
	done     chan error
	finished bool
}

func (u *s3Upload) Write(p []byte) (int, error) {
	if u.finished {
		return 0, fmt.Errorf("storage: write to %s after Commit or Abort", u.key)
	}
	return u.pw.Write(p)
}

func (u *s3Upload) Commit() error {
	if u.finished {
		return fmt.Errorf("storage: %s committed or aborted already", u.key)
	}
	u.finished = true
	_ = u.pw.Close()
	err := <-u.done
	u.cancel()
	if err != nil {
		return fmt.Errorf("storage: committing %s: %w", u.key, err)
	}
	return nil
}

func (u *s3Upload) Abort() {
	if u.finished {
		return
	}
	u.finished = true
	_ = u.pw.CloseWithError(errAborted)
	<-u.done
	u.cancel()
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if err := s.notChecked(); err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil && !isCode(err, "NoSuchKey") {
		return fmt.Errorf("storage: deleting %s: %w", key, err)
	}
	return nil
}

func (s *S3) mapError(key string, err error) error {
	resp := minio.ToErrorResponse(err)
	if resp.Code == "NoSuchKey" || resp.StatusCode == http.StatusNotFound && resp.Code != "NoSuchBucket" {
		return fmt.Errorf("%w: %s", ErrNotExist, key)
	}
	return fmt.Errorf("storage: %s: %w", key, err)
}

func isCode(err error, code string) bool {
	return minio.ToErrorResponse(err).Code == code
}
