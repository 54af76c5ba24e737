package main

import (
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// admin.token was written and renamed into place without a sync: after a
// power loss soon after the first start it was empty, and the gateway
// refused to start ("admin token file … is empty …: delete it"). What the
// first start wrote is on the disk once it is made.
func TestAdminTokenSurvivesAPowerLossRightAfterTheFirstStart(t *testing.T) {
	dataDir, afterCrash := testutil.CrashableDisk(t, 32<<20)
	cfg := &config.Config{}
	cfg.Server.DataDir = dataDir
	tok, err := loadAdminToken(cfg, true, new(string))
	if err != nil {
		t.Fatal(err)
	}
	crashed := afterCrash()
	got, err := readAdminTokenFile(filepath.Join(crashed, "admin.token"))
	if err != nil || got != tok {
		t.Fatalf("after the crash the admin token reads %q, %v; want %q", got, err, tok)
	}
	cfg.Server.DataDir = crashed
	if again, err := loadAdminToken(cfg, false, new(string)); err != nil || again != tok {
		t.Fatalf("the start after the crash: %q, %v; want the token made before it", again, err)
	}
}
