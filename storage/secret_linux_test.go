package storage

import (
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/internal/testutil"
)

// storage.secret was linked into place without syncing its directory: a
// power loss soon after the first start lost it, and the next start made
// another, which refused the upload and download URLs signed before.
func TestStorageSecretSurvivesAPowerLossRightAfterItIsMade(t *testing.T) {
	dataDir, afterCrash := testutil.CrashableDisk(t, 32<<20)
	made, err := LoadOrCreateSecret(filepath.Join(dataDir, "storage.secret"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := LoadOrCreateSecret(filepath.Join(afterCrash(), "storage.secret"))
	if err != nil || got != made {
		t.Fatalf("after the crash the secret is %q, %v; want the one made before it, %q", got, err, made)
	}
}
