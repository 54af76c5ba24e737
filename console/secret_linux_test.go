package console

import (
	"bytes"
	"testing"

	"github.com/tollgate/tollgate/internal/testutil"
)

// console.secret was linked into place without syncing its directory: a
// power loss soon after the first start lost it, the next start made
// another, and the fingerprint published in NATS refused that one.
func TestConsoleSecretSurvivesAPowerLossRightAfterItIsMade(t *testing.T) {
	dataDir, afterCrash := testutil.CrashableDisk(t, 32<<20)
	made, err := loadOrCreateSecret(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := loadOrCreateSecret(afterCrash())
	if err != nil || !bytes.Equal(got, made) {
		t.Fatalf("after the crash the secret is %x, %v; want the one made before it, %x", got, err, made)
	}
}
