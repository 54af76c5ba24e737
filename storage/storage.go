// Package storage keeps the files of batch jobs (inputs uploaded by clients,
// results written by the gateway) in object storage, behind one interface
// with two backends:
//
//   - local, the embedded default: files under <data_dir>/objects, and an
//     S3-compatible endpoint on a listener of its own that verifies browser
//     uploads (POST policy, AWS SigV4) and serves presigned downloads;
//   - s3: any S3-compatible store (AWS, MinIO, R2) through minio-go.
//
// Clients upload with a presigned POST (spec 4.3, 4.4) and download with a
// presigned GET (spec 4.8); the gateway itself reads and writes streams, so no
// object is ever held whole in memory.
package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Store is object storage for one bucket. Every method is safe for
// concurrent use.
type Store interface {
	// PresignPost returns the URL and form fields of a browser-style POST
	// upload of key: the client sends every field as a form field, then the
	// file as the last field, named "file", with no Authorization header. The
	// store accepts a file of 1 to maxBytes bytes until ttl has passed.
	PresignPost(ctx context.Context, key string, maxBytes int64, ttl time.Duration) (url string, fields map[string]string, err error)
	// PresignGet returns a URL that downloads key with a plain GET, and
	// when it stops working: ttl from now at most, as SigV4 counts whole
	// seconds (linkExpiry).
	PresignGet(ctx context.Context, key string, ttl time.Duration) (url string, expires time.Time, err error)
	// Stat describes key, or returns ErrNotExist.
	Stat(ctx context.Context, key string) (Info, error)
	// Open streams key from its start; ErrNotExist when missing. The caller
	// must Close the reader.
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	// OpenAt streams key from byte offset on, so a batch job resumed after a
	// crash continues where it stopped. An offset equal to the size gives an
	// empty stream; a larger one is an error.
	OpenAt(ctx context.Context, key string, offset int64) (io.ReadCloser, error)
	// Create starts writing key. Nothing is visible under key until Commit
	// succeeds; Abort (or a failed Commit) leaves key as it was. ctx bounds
	// the whole write, Commit included: the s3 backend uploads parts in the
	// background as they fill.
	Create(ctx context.Context, key string) (Upload, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
}

// Info is what Stat tells of an object.
type Info struct {
	Size int64
	// Version changes whenever the object is written again, even with
	// the same size: its ETag on S3, its modification time on disk.
	Version string
}

// Upload is an object being written by Store.Create. It must not be used
// from concurrently running goroutines. Exactly one of Commit or Abort must
// be called; Abort after Commit does nothing, so `defer u.Abort()` is the
// usual way to clean up on every error path.
type Upload interface {
	io.Writer
	// Commit makes everything written visible under the key, atomically: a
	// reader sees the old object or the whole new one.
	Commit() error
	// Abort discards what was written.
	Abort()
}

var (
	// ErrNotExist is returned for a key that holds no object: it was never
	// uploaded, the upload was refused, or it was deleted. For a batch input
	// the client must upload the file (spec 4.4) before starting the job.
	ErrNotExist = errors.New("storage: object does not exist")
	// ErrInvalidKey is returned for a key that cannot name an object: empty,
	// longer than 1024 bytes, not UTF-8, starting with "/", holding an empty,
	// "." or ".." segment, a backslash or a control character. Keys look like
	// batch/<account>/<job_id>/input.ndjson.
	ErrInvalidKey = errors.New("storage: invalid object key")
)

// MaxUploadBytes is the largest object a presigned POST can upload: S3's
// limit for POST uploads (5 GiB), also the spec's batch input limit.
const MaxUploadBytes = 5 << 30

// maxPresignTTL is SigV4's longest validity of a presigned request (7 days).
const maxPresignTTL = 7 * 24 * time.Hour

// CheckKey returns ErrInvalidKey (wrapped, saying why) unless key can name
// an object in both backends and as a path under the local data directory.
func CheckKey(key string) error {
	why := ""
	switch {
	case key == "":
		why = "empty"
	case len(key) > 1024:
		why = "longer than 1024 bytes"
	case !utf8.ValidString(key):
		why = "not UTF-8"
	case strings.HasPrefix(key, "/"):
		why = "starts with /"
	case strings.ContainsRune(key, '\\'):
		why = "holds a backslash"
	case strings.ContainsFunc(key, unicode.IsControl):
		why = "holds a control character"
	default:
		for _, seg := range strings.Split(key, "/") {
			if seg == "" || seg == "." || seg == ".." {
				why = fmt.Sprintf("holds the path segment %q", seg)
				break
			}
		}
	}
	if why != "" {
		return fmt.Errorf("%w %q: %s", ErrInvalidKey, key, why)
	}
	return nil
}

func checkPresign(key string, maxBytes int64, ttl time.Duration) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if maxBytes < 1 || maxBytes > MaxUploadBytes {
		return fmt.Errorf("storage: upload size limit %d is outside 1..%d bytes", maxBytes, int64(MaxUploadBytes))
	}
	return checkTTL(ttl)
}

func checkTTL(ttl time.Duration) error {
	if ttl < time.Second || ttl > maxPresignTTL {
		return fmt.Errorf("storage: presigned URL lifetime %s is outside 1s..%s", ttl, maxPresignTTL)
	}
	return nil
}

// linkExpiry is when a URL presigned at signedAt for ttl stops working.
// SigV4 signs with whole seconds (X-Amz-Date and X-Amz-Expires), so the
// link expires up to a second before signedAt+ttl: telling clients that
// later time had them fetch a link the store refused as expired.
// signedAt must be read before the URL is signed, as a signer reading
// the clock later can only sign a later second.
func linkExpiry(signedAt time.Time, ttl time.Duration) time.Time {
	return signedAt.Truncate(time.Second).Add(ttl.Truncate(time.Second))
}

// emptyReader is what OpenAt returns for an offset at the very end.
type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyReader) Close() error             { return nil }
