package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
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
}

// NewS3 connects to the store and checks that the bucket is there (creating
// it when opts.CreateBucket), so a wrong endpoint, key or bucket fails at
// start rather than at the first upload.
func NewS3(ctx context.Context, opts S3Options) (*S3, error) {
	if opts.Region == "" {
		opts.Region = "us-east-1"
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
	exists, err := client.BucketExists(ctx, opts.Bucket)
	if err != nil {
		return nil, fmt.Errorf("storage: s3 bucket %s at %s: %w", opts.Bucket, opts.Endpoint, err)
	}
	if !exists {
		if !opts.CreateBucket {
			return nil, fmt.Errorf("storage: s3 bucket %s does not exist at %s: create it, or set storage.s3.create_bucket", opts.Bucket, opts.Endpoint)
		}
		err := client.MakeBucket(ctx, opts.Bucket, minio.MakeBucketOptions{Region: opts.Region})
		if err != nil && !isCode(err, "BucketAlreadyOwnedByYou") {
			return nil, fmt.Errorf("storage: creating s3 bucket %s: %w", opts.Bucket, err)
		}
	}
	return s, nil
}

// PresignPost implements Store.
func (s *S3) PresignPost(ctx context.Context, key string, maxBytes int64, ttl time.Duration) (string, map[string]string, error) {
	if err := checkPresign(key, maxBytes, ttl); err != nil {
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
func (s *S3) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	if err := checkTTL(ttl); err != nil {
		return "", err
	}
	u, err := s.presigner.PresignedGetObject(ctx, s.bucket, key, ttl, nil)
	if err != nil {
		return "", fmt.Errorf("storage: presigning download of %s: %w", key, err)
	}
	return u.String(), nil
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := CheckKey(key); err != nil {
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
