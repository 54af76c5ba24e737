package miniotest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/tollgate/tollgate/internal/miniotest"
)

func client(t *testing.T, s *miniotest.Server) *minio.Client {
	t.Helper()
	c, err := minio.New(s.Endpoint(), &minio.Options{
		Creds:  credentials.NewStaticV4(s.AccessKey(), s.SecretKey(), ""),
		Region: miniotest.Region,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestServerKeepsObjectsAcrossRestart(t *testing.T) {
	srv := miniotest.Start(t)
	ctx := context.Background()
	c := client(t, srv)
	if err := c.MakeBucket(ctx, "kept", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutObject(ctx, "kept", "a/b.txt", strings.NewReader("hello"), 5, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	endpoint := srv.Endpoint()

	srv.Restart()
	if srv.Endpoint() != endpoint {
		t.Fatalf("restart moved the server from %s to %s", endpoint, srv.Endpoint())
	}
	obj, err := c.GetObject(ctx, "kept", "a/b.txt", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj)
	if err != nil || !bytes.Equal(got, []byte("hello")) {
		t.Fatalf("after restart: %q, %v; want hello", got, err)
	}

	srv.Stop()
	srv.Stop() // stopping a stopped server does nothing
	if _, err := c.BucketExists(ctx, "kept"); err == nil {
		t.Fatal("a stopped server still answers")
	}
}

func TestServersOfOneTestAreSeparate(t *testing.T) {
	a, b := miniotest.Start(t), miniotest.Start(t)
	if a.Endpoint() == b.Endpoint() || a.Dir() == b.Dir() || a.SecretKey() == b.SecretKey() {
		t.Fatalf("two servers share %s / %s / keys", a.Endpoint(), a.Dir())
	}
	ctx := context.Background()
	if err := client(t, a).MakeBucket(ctx, "only-a", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	if ok, err := client(t, b).BucketExists(ctx, "only-a"); err != nil || ok {
		t.Fatalf("b sees a's bucket: %v, %v", ok, err)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	message string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.message = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestStartWithoutMinioFailsAndSaysHowToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("GOPATH", t.TempDir())
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		miniotest.Start(rec)
		t.Error("Start returned without minio installed")
	}()
	<-done
	if !strings.Contains(rec.message, "make test") || !strings.Contains(rec.message, "scripts/minio.sh install") {
		t.Fatalf("failure message %q does not say how to install minio", rec.message)
	}
}
