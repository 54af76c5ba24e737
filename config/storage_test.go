package config

import (
	"os"
	"reflect"
	"testing"
	"time"
)

// TestStorageRestartOnly: the backend and its connection need a restart;
// the size limit and URL lifetimes, read per request, reload.
func TestStorageRestartOnly(t *testing.T) {
	data, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	old, err := parse("gateway.yaml", data, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	reloadable, _ := parse("gateway.yaml", data, noEnv)
	reloadable.Storage.MaxUploadBytes = 1 << 20
	reloadable.Storage.UploadTTL = time.Minute
	reloadable.Storage.DownloadTTL = 2 * time.Hour
	if diff := reloadable.RestartOnlyDiff(old); diff != nil {
		t.Errorf("reloadable storage changes reported as restart-only: %v", diff)
	}
	changed, _ := parse("gateway.yaml", data, noEnv)
	changed.Storage.Backend = "s3"
	changed.Storage.Local = StorageLocal{Listen: "0.0.0.0:9", PublicBaseURL: "https://x"}
	changed.Storage.S3 = StorageS3{Endpoint: "e", Region: "r", Bucket: "b", AccessKey: "a", SecretKey: "s",
		UseSSL: true, PublicEndpoint: "https://p", CreateBucket: true}
	want := []string{"storage.backend", "storage.local.listen", "storage.local.public_base_url",
		"storage.s3.endpoint", "storage.s3.region", "storage.s3.bucket", "storage.s3.access_key", "storage.s3.secret_key",
		"storage.s3.use_ssl", "storage.s3.public_endpoint", "storage.s3.create_bucket"}
	if diff := changed.RestartOnlyDiff(old); !reflect.DeepEqual(diff, want) {
		t.Errorf("RestartOnlyDiff = %v, want %v", diff, want)
	}
}
