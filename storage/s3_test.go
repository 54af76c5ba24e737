package storage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/tollgate/tollgate/internal/miniotest"
	"github.com/tollgate/tollgate/internal/testutil"
)

const testBucket = "tollgate-test"

func s3Backend(t *testing.T, srv *miniotest.Server) backend {
	ctx := context.Background()
	s, err := NewS3(ctx, S3Options{
		Endpoint: srv.Endpoint(), Region: miniotest.Region, Bucket: testBucket,
		AccessKey: srv.AccessKey(), SecretKey: srv.SecretKey(), CreateBucket: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	cred := credential{accessKey: srv.AccessKey(), region: miniotest.Region}
	return backend{
		store: s,
		minio: true,
		// Signed by this package's SigV4 code, which MinIO must accept
		// like AWS's: the expiry, not the signature, is what fails.
		expiredPost: func(t *testing.T, key string) (string, map[string]string) {
			fields, err := signPost(srv.SecretKey(), cred, testBucket, key, 1<<20, time.Now().Add(-2*time.Hour), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return srv.URL() + "/" + testBucket, fields
		},
		expiredGet: func(t *testing.T, key string) string {
			return presignedGetURL(srv, key, time.Now().Add(-2*time.Hour))
		},
		leftovers: func(t *testing.T) []string {
			var left []string
			for obj := range s.client.ListObjects(ctx, testBucket, minio.ListObjectsOptions{Recursive: true}) {
				if obj.Err != nil {
					t.Fatal(obj.Err)
				}
				left = append(left, obj.Key)
			}
			for up := range s.client.ListIncompleteUploads(ctx, testBucket, "", true) {
				if up.Err != nil {
					t.Fatal(up.Err)
				}
				left = append(left, "incomplete upload of "+up.Key)
			}
			return left
		},
	}
}

// presignedGetURL signs a GET of key in the test bucket with this
// package's SigV4 code, at signedAt, valid for an hour.
func presignedGetURL(srv *miniotest.Server, key string, signedAt time.Time) string {
	c := credential{accessKey: srv.AccessKey(), region: miniotest.Region, date: signedAt.UTC().Format(scopeDateFormat)}
	p := "/" + testBucket + "/" + key
	return srv.URL() + uriEncode(p, true) + "?" + presignQuery(srv.SecretKey(), c, srv.Endpoint(), p, signedAt, time.Hour)
}

func TestS3(t *testing.T) {
	srv := miniotest.Start(t)
	testStore(t, s3Backend(t, srv))
}

// TestSigV4AgainstMinio: what the local backend signs, a real S3 server
// accepts: a POST policy and a presigned GET made by this package's code
// for MinIO's credential.
func TestSigV4AgainstMinio(t *testing.T) {
	srv := miniotest.Start(t)
	b := s3Backend(t, srv)
	ctx := context.Background()
	key := "batch/acct 1/job+1/input ü.ndjson"
	cred := credential{accessKey: srv.AccessKey(), region: miniotest.Region}
	fields, err := signPost(srv.SecretKey(), cred, testBucket, key, 1<<20, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	content := ndjson(30)
	if status, body := upload(t, srv.URL()+"/"+testBucket, fields, content); status != 204 {
		t.Fatalf("MinIO refused our POST policy: %d\n%s", status, body)
	}
	if got := readAll(t)(b.store.Open(ctx, key)); got != string(content) {
		t.Fatalf("stored %q", got)
	}
	if status, body := get(t, presignedGetURL(srv, key, time.Now())); status != 200 || string(body) != string(content) {
		t.Fatalf("MinIO refused our presigned GET: %d\n%s", status, body)
	}
}

func TestS3PublicEndpointAndMissingBucket(t *testing.T) {
	srv := miniotest.Start(t)
	ctx := context.Background()
	opts := S3Options{Endpoint: srv.Endpoint(), Bucket: "not-there", AccessKey: srv.AccessKey(), SecretKey: srv.SecretKey()}
	if _, err := NewS3(ctx, opts); err == nil || !strings.Contains(err.Error(), "create_bucket") {
		t.Fatalf("NewS3 with a missing bucket = %v, want an error that names create_bucket", err)
	}
	opts.SecretKey = "wrong"
	opts.CreateBucket = true
	if _, err := NewS3(ctx, opts); err == nil {
		t.Fatal("NewS3 with a wrong secret key succeeded")
	}
	opts.SecretKey = srv.SecretKey()
	opts.PublicEndpoint = "https://files.example.com"
	s, err := NewS3(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	url, _, err := s.PresignPost(ctx, "k", 10, time.Minute)
	if err != nil || !strings.HasPrefix(url, "https://files.example.com/not-there") {
		t.Fatalf("upload URL %q, %v: want it under the public endpoint", url, err)
	}
	get, _, err := s.PresignGet(ctx, "k", time.Minute)
	if err != nil || !strings.HasPrefix(get, "https://files.example.com/not-there/k?") {
		t.Fatalf("download URL %q, %v: want it under the public endpoint", get, err)
	}
	// The bucket was created, with the access key minio-go would use.
	c, _ := minio.New(srv.Endpoint(), &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey(), srv.SecretKey(), "")})
	if ok, err := c.BucketExists(ctx, "not-there"); !ok || err != nil {
		t.Fatalf("create_bucket did not create it: %v, %v", ok, err)
	}
}

// TestS3StoreDownAtStart: a store that did not answer at start failed
// NewS3 (`storage: s3 bucket … connection refused`), and with it the
// start of the whole gateway, so a gateway restarted during an S3
// outage served nothing. NewS3 must return the store, which fails until
// the store answers, and then makes the bucket and works within seconds.
func TestS3StoreDownAtStart(t *testing.T) {
	srv := miniotest.Start(t)
	srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log testutil.Log
	began := time.Now()
	s, err := NewS3(ctx, S3Options{Endpoint: srv.Endpoint(), Region: miniotest.Region, Bucket: testBucket,
		AccessKey: srv.AccessKey(), SecretKey: srv.SecretKey(), CreateBucket: true, Logf: log.Logf})
	if err != nil {
		t.Fatalf("NewS3 with the store down: %v, want the store, checked again in the background", err)
	}
	t.Logf("NewS3 returned in %s", time.Since(began).Round(time.Millisecond))
	if _, err := s.Stat(ctx, "batch/a/input"); err == nil || errors.Is(err, ErrNotExist) || !strings.Contains(err.Error(), "the bucket is not checked yet") {
		t.Fatalf("Stat before the store answered: %v, want the outage", err)
	}
	if _, _, err := s.PresignPost(ctx, "batch/a/input", 10, time.Minute); err == nil {
		t.Fatal("PresignPost before the store answered succeeded: the form may name a bucket not made yet")
	}
	srv.Restart()
	back := time.Now()
	for {
		_, err := s.Stat(ctx, "batch/a/input")
		if errors.Is(err, ErrNotExist) {
			break
		}
		if time.Since(back) > 10*time.Second {
			t.Fatalf("Stat 10 s after the store came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the store worked %s after it came back", time.Since(back).Round(time.Millisecond))
	up, err := s.Create(ctx, "batch/a/input")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := up.Write([]byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	if err := up.Commit(); err != nil {
		t.Fatal(err)
	}
	// The check that found the bucket logs its return just after it lets
	// the methods work: on a busy machine the upload can end before that.
	testutil.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if log.Count("answers now") == 0 {
			return fmt.Errorf("no line says the store answers now; logged:\n%s", log.String())
		}
		return nil
	})
	if logged := log.Matching(); len(logged) != 2 || !strings.Contains(logged[0], "connection refused") || !strings.Contains(logged[0], "starting without it") ||
		!strings.Contains(logged[1], "answers now") {
		t.Errorf("logged %q, want the first failure and the return", logged)
	}
}
