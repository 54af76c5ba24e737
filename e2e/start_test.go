package e2e

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// A gateway whose port is taken stops before its first-start work: it used
// to print the demo key, which is shown only once, and an OPENAI_BASE_URL
// naming the other process's port, then fail to listen, so the start that
// followed never showed the key.
// So does one whose upload port (storage.local.listen) is taken: it was
// bound after the first-start work.
func TestTakenPortEndsTheStartBeforeFirstStartWork(t *testing.T) {
	for _, port := range []string{"server.listen", "storage.local.listen"} {
		t.Run(port, func(t *testing.T) { testTakenPort(t, port) })
	}
}

func testTakenPort(t *testing.T, port string) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dataDir := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if port == "server.listen" {
		cmd = lonelyServe(ctx, t, taken.Addr().String(), dataDir)
	} else {
		cmd = lonelyServe(ctx, t, freeAddr(t), dataDir)
		cmd.Env = append(cmd.Env, "TOLLGATE_STORAGE_LISTEN="+taken.Addr().String()) // the last one counts
	}
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("serve on a taken port: err %v (context %v), output:\n%s", err, ctx.Err(), out)
	}
	if !strings.Contains(string(out), "address already in use") {
		t.Fatalf("the error does not say the port is taken:\n%s", out)
	}
	if strings.Contains(string(out), "First start") {
		t.Fatalf("first-start work done before the port was bound:\n%s", out)
	}
	for _, f := range []string{"admin.token", "demo.created"} {
		if _, err := os.Stat(filepath.Join(dataDir, f)); err == nil {
			t.Errorf("%s written by a start that could not listen", f)
		}
	}
}

// A SIGHUP sent while the gateway starts (systemd's reload right after its
// start) is a reload once the gateway runs. It ended the process, which
// systemd counts a clean exit, so Restart=on-failure left it down.
func TestSIGHUPWhileStartingIsAReload(t *testing.T) {
	dir := t.TempDir()
	listen := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	logPath := filepath.Join(dir, "serve.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	output := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	cmd := lonelyServe(ctx, t, listen, filepath.Join(dir, "data"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The port is bound early in the start, long before the config watcher
	// runs: the signal lands in between.
	checkFor(t, 30*time.Second, 5*time.Millisecond, func() error {
		c, err := net.Dial("tcp", listen)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		select {
		case err := <-exited:
			t.Fatalf("the gateway ended on a SIGHUP sent while it started: %v\n%s", err, output())
		default:
		}
		if !strings.Contains(output(), "SIGHUP: reloading") {
			return errors.New("no reload logged yet")
		}
		return nil
	})
	_ = cmd.Process.Signal(syscall.SIGTERM)
	<-exited
}

// lonelyServe is `tollgate serve` on the repository's gateway.yaml with a
// listen address and data dir of its own, its embedded NATS and storage on
// free ports, and no upstream, ClickHouse or admin token.
func lonelyServe(ctx context.Context, t *testing.T, listen, dataDir string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, tollgateBin, "serve")
	cmd.Env = append(os.Environ(),
		"TOLLGATE_CONFIG="+filepath.Join(repoRoot, "gateway.yaml"),
		"TOLLGATE_LISTEN="+listen,
		"TOLLGATE_DATA_DIR="+dataDir,
		"TOLLGATE_ADMIN_TOKEN=",
		"TOLLGATE_NATS_LISTEN="+freeAddr(t),
		"TOLLGATE_STORAGE_LISTEN="+freeAddr(t),
		"TOLLGATE_DEBUG_LISTEN=",
		"TOLLGATE_CONSUME_IN_SERVE=false",
		"NATS_URL=", "CLICKHOUSE_DSN=", "UPSTREAM_BASE_URL=http://"+freeAddr(t)+"/v1")
	cmd.SysProcAttr = testutil.DieWithParent()
	return cmd
}
