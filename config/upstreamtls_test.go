package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// An upstream's settings hold its tls_ca file's content as loaded, so a
// reload (SIGHUP) after the file was replaced under the same name
// rebuilds the upstream with the new CAs; compared by name alone, the
// upstream in force would have kept trusting the old ones.
func TestUpstreamTLSCAContentIsPartOfItsSettings(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	yaml := fmt.Sprintf("upstreams:\n  - {name: u, base_url: https://llm.internal.example/v1, tls_ca: %s}\n"+
		"models:\n  - {id: m, upstream: u, context_length: 10, max_output_length: 5}\n", caFile)
	load := func(pem []byte) Upstream {
		t.Helper()
		if err := os.WriteFile(caFile, pem, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := Parse("gateway.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Upstreams[0]
	}
	first := testutil.NewTLSCertificate(t).CAPEM
	before := load(first)
	if string(before.TLSCAPEM()) != string(first) {
		t.Fatalf("TLSCAPEM is %q, want the file's content", before.TLSCAPEM())
	}
	if again := load(first); again != before {
		t.Fatal("the same file loaded twice makes settings that differ: every reload would rebuild the upstream")
	}
	if after := load(testutil.NewTLSCertificate(t).CAPEM); after == before {
		t.Fatal("a replaced tls_ca file leaves the upstream's settings equal: a reload keeps the old CAs")
	}
}

// A tls_ca naming a pipe is refused without being read: reading it held
// `config check`, and every reload of a running gateway, until something
// wrote to the pipe.
func TestUpstreamTLSCAPipeIsRefusedUnread(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "ca.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf("upstreams:\n  - {name: u, base_url: https://llm.internal.example/v1, tls_ca: %s}\n"+
		"models:\n  - {id: m, upstream: u, context_length: 10, max_output_length: 5}\n", fifo)
	done := make(chan error, 1)
	go func() {
		_, err := Parse("gateway.yaml", []byte(yaml))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "is not a regular file") {
			t.Fatalf("Parse = %v, want the tls_ca refused as not a regular file", err)
		}
	case <-time.After(10 * time.Second):
		// Unblock the reader so the test binary can end.
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("Parse still reading a tls_ca that names a pipe after 10 s")
	}
}
