package chtest_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/chtest"
)

func TestServerKeepsDataAndPortsAcrossRestartAndKill(t *testing.T) {
	srv := chtest.Start(t)
	dsn := srv.DSN()
	srv.Query(t, "CREATE TABLE kept (x UInt64) ENGINE = MergeTree ORDER BY x; INSERT INTO kept (x) VALUES (1), (2)")

	srv.Restart()
	if got := srv.Query(t, "SELECT sum(x) FROM kept"); got != "3\n" {
		t.Fatalf("after restart: sum %q, want 3", got)
	}
	srv.Kill()
	srv.Stop() // stopping a stopped server does nothing
	srv.Restart()
	if got := srv.Query(t, "SELECT sum(x) FROM kept"); got != "3\n" {
		t.Fatalf("after kill and restart: sum %q, want 3", got)
	}
	if srv.DSN() != dsn {
		t.Fatalf("restart moved the server from %s to %s", dsn, srv.DSN())
	}
}

func TestServersOfOneTestAreSeparate(t *testing.T) {
	a, b := chtest.Start(t), chtest.Start(t)
	if a.DSN() == b.DSN() || a.Dir() == b.Dir() {
		t.Fatalf("two servers share %s / %s", a.DSN(), a.Dir())
	}
	a.Query(t, "CREATE TABLE only_a (x UInt8) ENGINE = Memory")
	if got := b.Query(t, "EXISTS TABLE only_a"); got != "0\n" {
		t.Fatalf("b sees a's table: %q", got)
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

func TestStartWithoutClickHouseFailsAndSaysHowToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		chtest.Start(rec)
		t.Error("Start returned without ClickHouse installed")
	}()
	<-done
	if !strings.Contains(rec.message, "make test") || !strings.Contains(rec.message, "scripts/clickhouse.sh install") {
		t.Fatalf("failure message %q does not say how to install ClickHouse", rec.message)
	}
}
