package storage

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/miniotest"
)

func TestDefaultPublicBaseURL(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8081":    "http://127.0.0.1:8081",
		"0.0.0.0:8081":      "http://127.0.0.1:8081",
		"[::]:8081":         "http://127.0.0.1:8081",
		":8081":             "http://127.0.0.1:8081",
		"files.internal:80": "http://files.internal:80",
		"[::1]:8081":        "http://[::1]:8081",
	} {
		if got := DefaultPublicBaseURL(listen); got != want {
			t.Errorf("DefaultPublicBaseURL(%q) = %q, want %q", listen, got, want)
		}
	}
}

func TestFromConfig(t *testing.T) {
	ctx := context.Background()
	dataDir := t.TempDir()
	cfg := parseConfig(t, `
server: {data_dir: "`+dataDir+`"}
upstreams: [{name: u, base_url: "http://127.0.0.1:8000/v1"}]
storage:
  local: {listen: "0.0.0.0:18081"}
`)
	st, err := FromConfig(ctx, cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	l, ok := st.(*Local)
	if !ok {
		t.Fatalf("the default backend is %T, want *Local", st)
	}
	if got := l.bucketURL(); got != "http://127.0.0.1:18081/tollgate" {
		t.Fatalf("upload URL %s", got)
	}
	if _, err := os.Stat(filepath.Join(dataDir, SecretFile)); err != nil {
		t.Fatalf("no secret in the data dir: %v", err)
	}

	srv := miniotest.Start(t)
	t.Setenv("S3_ENDPOINT", srv.Endpoint())
	t.Setenv("S3_ACCESS_KEY", srv.AccessKey())
	t.Setenv("S3_SECRET_KEY", srv.SecretKey())
	cfg = parseConfig(t, `
upstreams: [{name: u, base_url: "http://127.0.0.1:8000/v1"}]
storage:
  backend: s3
  s3:
    endpoint: ${S3_ENDPOINT}
    bucket: from-config
    access_key: ${S3_ACCESS_KEY}
    secret_key: ${S3_SECRET_KEY}
    create_bucket: true
`)
	st, err = FromConfig(ctx, cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := st.(*S3); !ok || s.bucket != "from-config" {
		t.Fatalf("backend s3 built %T %+v", st, st)
	}
}

func parseConfig(t *testing.T, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("gateway.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
