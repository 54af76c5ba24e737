package storage

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// An upload the disk was too full for was a 500 InternalError, "Please
// try again", which no retry could make succeed; the log alone said no
// space left on device. It is MinIO's 507 XMinioStorageFull, saying the
// storage is full, and leaves nothing behind.
func TestLocalUploadToAFullDiskIsInsufficientStorage(t *testing.T) {
	dataDir := testutil.SmallDisk(t, 1<<20)
	l, _, _ := startLocal(t, LocalOptions{DataDir: dataDir})
	key := "batch/acct-1/job-1/input.ndjson"
	url, fields, err := l.PresignPost(context.Background(), key, 8<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	status, body := upload(t, url, fields, ndjson(200_000)) // 3.4 MB
	wantS3Error(t, status, body, http.StatusInsufficientStorage, "XMinioStorageFull")
	if !strings.Contains(string(body), "The storage is full") {
		t.Errorf("the message does not say the storage is full:\n%s", body)
	}
	if left := filesUnder(t, filepath.Join(dataDir, "objects")); len(left) != 0 {
		t.Errorf("the refused upload left %v", left)
	}
	wantNotExist(t, l, key)

	// A file that fits is taken: the refusal was the disk's, not the form's.
	url, fields, err = l.PresignPost(context.Background(), key, 8<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := upload(t, url, fields, ndjson(10)); status != http.StatusNoContent && status != http.StatusOK && status != http.StatusCreated {
		t.Fatalf("a small upload: %d\n%s", status, body)
	}
}
