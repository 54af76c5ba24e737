//go:build unix

package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tollgate/tollgate/meter"
)

// TestSecondServeOnADataDirOpensNoStore: a second serve on a running
// gateway's data_dir started its embedded NATS on the live store
// ("Restored 19 messages for stream USAGE"), rewrote the streams' index
// files, and only then stopped on the outbox lock. It must stop before
// anything in data_dir is opened.
func TestSecondServeOnADataDirOpensNoStore(t *testing.T) {
	dir := t.TempDir()
	// What a running gateway holds: data_dir's lock and its outbox's.
	f, err := os.OpenFile(filepath.Join(dir, dataDirLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	ob, err := meter.OpenOutboxWith(filepath.Join(dir, "outbox"), meter.OutboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()

	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("server:\n  data_dir: "+dir+"\n  listen: 127.0.0.1:29110\n  demo_credit_usd: \"0\"\n"+
		"nats:\n  embedded_listen: 127.0.0.1:29111\nstorage:\n  local:\n    listen: 127.0.0.1:29112\n"+
		"upstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n"+
		"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = runServe([]string{cfg})
	if !errors.Is(err, errDataDirInUse) {
		t.Fatalf("second serve: %v, want the data_dir in use", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nats")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the second serve made or opened data_dir/nats (%v)", err)
	}
}

// A taken server.listen names the setting and its variable: "listening on
// 127.0.0.1:10100: address already in use" left a user beside another
// gateway to find which of four addresses it was.
func TestTakenListenNamesTheSetting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:29113")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte("server:\n  data_dir: "+dir+"\n  listen: 127.0.0.1:29113\n  demo_credit_usd: \"0\"\n"+
		"nats:\n  embedded_listen: 127.0.0.1:29114\nstorage:\n  local:\n    listen: 127.0.0.1:29115\n"+
		"upstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n"+
		"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := runServe([]string{cfg}); err == nil || !strings.Contains(err.Error(), "server.listen (TOLLGATE_LISTEN") {
		t.Fatalf("serve on a taken port: %v, want server.listen (TOLLGATE_LISTEN) named", err)
	}
}
