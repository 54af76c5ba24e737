// Package miniotest runs a private MinIO server (S3-compatible object
// storage) for a test, the way httptest runs an HTTP server: its own
// directory, its own loopback port, its own keys, stopped when the test ends.
//
// The binary is the one scripts/minio.sh install builds (a pinned version)
// into $(go env GOPATH)/bin; `make test` does that. A test without it fails,
// it is never skipped.
package miniotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"go/build"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

const (
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
	// Region is the region of every test server.
	Region = "us-east-1"
)

// Server is a minio process owned by one test. Its methods must be called
// from the test's goroutine (they fail the test on error).
type Server struct {
	t         testing.TB
	dir       string
	port      int
	accessKey string
	secretKey string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// Start starts a server in a fresh temporary directory and stops it when
// the test ends. It fails the test if the binary is missing or the server
// is not ready within a minute.
func Start(t testing.TB) *Server {
	t.Helper()
	binary(t) // fail early and clearly when the binary is missing
	s := &Server{t: t, dir: t.TempDir(), accessKey: "tollgate", secretKey: randomHex(16)}
	t.Cleanup(s.stopQuietly)
	// The port is picked free, but another process can take it before the
	// server binds it; a new port then is as good as the old one.
	for attempt := 1; ; attempt++ {
		s.port = testutil.FreePort(t)
		err := s.launch()
		if err == nil {
			return s
		}
		if attempt == 3 || !strings.Contains(s.logTail(), "port is already in use") {
			t.Fatalf("miniotest: %v", err)
		}
	}
}

// Endpoint is host:port of the S3 API, as minio-go and storage.S3Options
// want it (plain http).
func (s *Server) Endpoint() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// URL is the S3 API's base URL.
func (s *Server) URL() string { return "http://" + s.Endpoint() }

// AccessKey and SecretKey are the root credentials.
func (s *Server) AccessKey() string { return s.accessKey }

// SecretKey is the root user's password.
func (s *Server) SecretKey() string { return s.secretKey }

// Dir holds the server's data (data/) and log (minio.log).
func (s *Server) Dir() string { return s.dir }

// Stop shuts the server down and waits until it has exited; clients then
// get connection refused. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.t.Helper()
	if err := s.stop(syscall.SIGTERM); err != nil {
		s.t.Fatalf("miniotest: %v", err)
	}
}

// Restart starts the server again (stopping it first if it runs) with the
// same data, port and keys, and waits until it is ready.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.launch(); err != nil {
		s.t.Fatalf("miniotest: restarting: %v", err)
	}
}

func (s *Server) launch() error {
	bin := binary(s.t)
	logFile, err := os.OpenFile(filepath.Join(s.dir, "minio.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening server log: %w", err)
	}
	defer logFile.Close() // the child holds its own descriptor
	// The console is off, but minio still wants an address for it: a port
	// of the kernel's choosing.
	cmd := exec.Command(bin, "server", "--quiet", "--address", s.Endpoint(),
		"--console-address", "127.0.0.1:0", filepath.Join(s.dir, "data"))
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+s.accessKey, "MINIO_ROOT_PASSWORD="+s.secretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = testutil.DieWithParent()
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("minio exited during startup:\n%s", s.logTail())
		default:
		}
		err := s.ready()
		if err == nil {
			s.t.Logf("miniotest: minio ready on %s in %v", s.Endpoint(), time.Since(began).Round(time.Millisecond))
			return nil
		}
		if time.Now().After(deadline) {
			_ = s.stop(syscall.SIGKILL)
			return fmt.Errorf("minio was not ready within %v: %v\n%s", startTimeout, err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/minio/health/ready", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readiness probe: %s", resp.Status)
	}
	return nil
}

func (s *Server) stop(sig syscall.Signal) error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling minio: %w", err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("minio ignored %v for %v and was killed", sig, stopTimeout)
	}
}

// stopQuietly ends the server when the test is over; nothing in it is
// needed any more.
func (s *Server) stopQuietly() {
	if err := s.stop(syscall.SIGKILL); err != nil {
		s.t.Errorf("miniotest: %v", err)
	}
}

func (s *Server) logTail() string {
	data, err := os.ReadFile(filepath.Join(s.dir, "minio.log"))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// binary finds the minio that scripts/minio.sh install builds: in
// $(go env GOPATH)/bin, else on PATH.
func binary(t testing.TB) string {
	t.Helper()
	var tried []string
	for _, dir := range gopaths() {
		p := filepath.Join(dir, "bin", "minio")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
		tried = append(tried, p)
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p
	}
	t.Fatalf("miniotest: minio is not installed (looked at %s and on PATH): run `make test`, or scripts/minio.sh install",
		strings.Join(tried, ", "))
	return ""
}

// gopaths lists the GOPATH entries, as `go env GOPATH` would print them.
func gopaths() []string {
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		gopath = build.Default.GOPATH
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil && strings.TrimSpace(string(out)) != "" {
		gopath = strings.TrimSpace(string(out))
	}
	return filepath.SplitList(gopath)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
