//go:build unix

package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// The first start's export lines, pasted into another terminal, point
// the admin CLI at this gateway when server.listen asks for a free port:
// TOLLGATE_LISTEN=127.0.0.1:0 was exported as given, and bin/tollgate
// accounts there called http://127.0.0.1:0. And each line is printed
// once: TOLLGATE_LISTEN and TOLLGATE_DATA_DIR were in both the admin
// token's block and the demo key's.
func TestFirstStartBannerExportsTheBoundAddressOnce(t *testing.T) {
	firstStartDir(t, "127.0.0.1:0",
		fmt.Sprintf("nats:\n  embedded_listen: 127.0.0.1:%d\nstorage:\n  local:\n    listen: 127.0.0.1:%d\n", testutil.FreePort(t), testutil.FreePort(t))+
			"plugins:\n  engine: lexical\n")

	// What serve prints on stderr, the banner among it.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	var mu sync.Mutex
	var stderr strings.Builder
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			mu.Lock()
			stderr.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	printed := func() string {
		mu.Lock()
		defer mu.Unlock()
		return stderr.String()
	}
	served := make(chan error, 1)
	go func() { served <- runServe(nil) }()
	defer func() {
		select {
		case err := <-served: // ended on its own: no SIGTERM, which would end the test
			t.Errorf("serve ended: %v", err)
		default:
			_ = syscall.Kill(os.Getpid(), syscall.SIGTERM) // caught by runServe
			<-served
		}
		os.Stderr = saved
		w.Close()
		<-copied
		if t.Failed() {
			t.Logf("serve printed:\n%s", printed())
		}
	}()
	testutil.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(printed(), "export OPENAI_BASE_URL=") {
			return fmt.Errorf("no demo key printed yet")
		}
		return nil
	})

	exports := map[string][]string{}
	for line := range strings.Lines(printed()) {
		if name, value, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "="); ok && strings.HasPrefix(strings.TrimSpace(line), "export ") {
			exports[name] = append(exports[name], value)
		}
	}
	for name, values := range exports {
		if len(values) != 1 {
			t.Errorf("export %s printed %d times: %q", name, len(values), values)
		}
	}
	listen := exports["TOLLGATE_LISTEN"]
	if len(listen) == 0 {
		t.Fatal("no export TOLLGATE_LISTEN")
	}
	if _, port, err := net.SplitHostPort(listen[0]); err != nil || port == "0" {
		t.Fatalf("export TOLLGATE_LISTEN=%s: the port asked for, not the one bound", listen[0])
	}
	if want := "http://" + listen[0] + "/v1"; exports["OPENAI_BASE_URL"][0] != want {
		t.Errorf("OPENAI_BASE_URL=%s, TOLLGATE_LISTEN=%s", exports["OPENAI_BASE_URL"][0], listen[0])
	}

	// The other terminal: a shell with only what the banner exports.
	t.Setenv("TOLLGATE_LISTEN", "")
	t.Setenv("TOLLGATE_DATA_DIR", "")
	for name, values := range exports {
		t.Setenv(name, values[0])
	}
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		out, err := captureStdout(t, func() error { return runAccounts([]string{"get", "demo"}) })
		if err != nil || !strings.Contains(out, `"id": "demo"`) {
			return fmt.Errorf("accounts get demo in the other terminal: %v\n%s", err, out)
		}
		return nil
	})
}
