package broker

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// handshakeCounter is a nats-server logger counting the TLS handshakes
// it refused.
type handshakeCounter struct {
	mu      sync.Mutex
	refused int
}

func (h *handshakeCounter) count() int { h.mu.Lock(); defer h.mu.Unlock(); return h.refused }
func (h *handshakeCounter) Errorf(format string, v ...any) {
	if strings.Contains(fmt.Sprintf(format, v...), "TLS handshake error") {
		h.mu.Lock()
		h.refused++
		h.mu.Unlock()
	}
}
func (*handshakeCounter) Noticef(string, ...any) {}
func (*handshakeCounter) Warnf(string, ...any)   {}
func (*handshakeCounter) Fatalf(string, ...any)  {}
func (*handshakeCounter) Debugf(string, ...any)  {}
func (*handshakeCounter) Tracef(string, ...any)  {}

// An external NATS that came back requiring a client certificate had
// `nats: remote error: tls: certificate required` logged at each
// reconnection, about once a second, for as long as it lasted.
func TestRefusedReconnectionsAreNotLoggedEachTime(t *testing.T) {
	dir := t.TempDir()
	cert := testutil.NewTLSCertificate(t)
	caPath := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caPath, cert.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	var handshakes handshakeCounter
	start := func(port int, requireClientCert bool) *server.Server {
		tc := &tls.Config{Certificates: []tls.Certificate{cert.Cert}, MinVersion: tls.VersionTLS12}
		if requireClientCert {
			tc.ClientAuth, tc.ClientCAs = tls.RequireAndVerifyClientCert, cert.Pool
		}
		srv, err := server.NewServer(&server.Options{
			Host: "127.0.0.1", Port: port, NoSigs: true,
			TLS: true, TLSVerify: requireClientCert, TLSConfig: tc, TLSTimeout: 2,
		})
		if err != nil {
			t.Fatal(err)
		}
		srv.SetLogger(&handshakes, false, false)
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats server not ready")
		}
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		return srv
	}
	srv := start(server.RANDOM_PORT, false)
	var log testutil.Log
	b, err := Start(testContext(t), config.NATS{URL: srv.ClientURL(), TLSCA: caPath, Replicas: 1}, dir, log.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	start(port, true)

	testutil.CheckFor(t, 8*time.Second, 20*time.Millisecond, func() error {
		if n := handshakes.count(); n < 4 {
			return fmt.Errorf("the server refused %d reconnections, want 4", n)
		}
		// The client reports its refusals on its own goroutine, after
		// the server counted them: wait until two are held.
		b.connLog.mu.Lock()
		held := b.connLog.held
		b.connLog.mu.Unlock()
		if held < 2 {
			return fmt.Errorf("%d lines held back, want 2 or more", held)
		}
		return nil
	})
	// The disconnection went out at once; what followed within
	// connLogEvery is held back.
	if got := log.Matching("nats:"); len(got) != 1 || !strings.Contains(got[0], "disconnected") {
		t.Fatalf("logged %q; want the disconnection alone", got)
	}
	b.Close()
	got := log.Matching("certificate required")
	if len(got) != 1 || !strings.Contains(got[0], "lines about the nats connection") {
		t.Fatalf("at close, logged %q (all: %q); want the latest refusal once, with how many lines were left out", got, log.Matching("nats:"))
	}
}

// The latest line held back goes out when its window ends, with how many
// were left out, even when no line comes after it: the log's last line
// is the connection's latest state.
func TestConnLogWritesTheLatestHeldLineAtTheWindowsEnd(t *testing.T) {
	var log testutil.Log
	cl := newConnLog(log.Logf, 100*time.Millisecond)
	defer cl.close()
	cl.printf("nats: disconnected: EOF")
	for range 3 {
		cl.printf("nats: remote error: refused")
	}
	cl.printf("nats: reconnected to nats://127.0.0.1:4222")
	if got := log.Matching("nats:"); len(got) != 1 {
		t.Fatalf("within the window, logged %q; want the first line alone", got)
	}
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := log.Matching("reconnected"); len(got) != 1 || !strings.Contains(got[0], "the latest of 4 lines") {
			return fmt.Errorf("logged %q", log.Matching("nats:"))
		}
		return nil
	})
	if got := log.Matching("remote error"); len(got) != 0 {
		t.Fatalf("logged %q, lines the latest replaced", got)
	}
}

// A line that comes as its window ends, before the window's flush runs,
// goes out once with the held lines counted in: written first and the
// held one after it, the log's last line was the older state, and two
// lines went out at once.
func TestConnLogLineAtTheWindowsEndTakesTheHeldOnes(t *testing.T) {
	var log testutil.Log
	cl := newConnLog(log.Logf, time.Hour) // the flush never fires by itself
	defer cl.close()
	cl.printf("nats: disconnected: EOF")
	cl.printf("nats: consumer not active (older)")
	cl.mu.Lock()
	cl.next = time.Now().Add(-time.Millisecond) // the window just ended
	cl.mu.Unlock()
	cl.printf("nats: consumer not active (newer)")
	got := log.Matching("nats:")
	if len(got) != 2 || !strings.Contains(got[1], "(newer)") || !strings.Contains(got[1], "the latest of 2 lines") {
		t.Fatalf("logged %q; want the first line, then the newer line counting the held one", got)
	}
	cl.close()
	if got := log.Matching("older"); len(got) != 0 {
		t.Fatalf("the held older line was written too: %q", got)
	}
}

// A held line written when its window ends carries the time it came: a
// "reconnected" 40 ms after a node was killed, logged 10 s later without
// it, read as a 10 s outage.
func TestConnLogHeldLineSaysWhenItCame(t *testing.T) {
	var log testutil.Log
	cl := newConnLog(log.Logf, 1500*time.Millisecond)
	defer cl.close()
	cl.printf("nats: disconnected: EOF")
	came := time.Now().UTC()
	cl.printf("nats: reconnected to nats://127.0.0.1:4222")
	cameBy := time.Now().UTC()
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		got := log.Matching("reconnected")
		if len(got) != 1 {
			return fmt.Errorf("logged %q", log.Matching("nats:"))
		}
		at, atLatest := came.Format("2006-01-02T15:04:05"), cameBy.Format("2006-01-02T15:04:05")
		if !strings.Contains(got[0], "(at "+at) && !strings.Contains(got[0], "(at "+atLatest) {
			return fmt.Errorf("logged %q; want it to say it came at %s", got[0], at)
		}
		return nil
	})
}
