// Package chtest runs a private ClickHouse server for a test, the way
// httptest runs an HTTP server: its own directory, its own loopback ports,
// stopped when the test ends. Tests can stop, kill, pause and restart it to
// see how billing behaves while ClickHouse is away.
//
// The config comes from scripts/clickhouse.sh, which CI and developers use
// too, so there is one definition of a test server. The binary must be
// installed: `make test` (or scripts/clickhouse.sh install) does that, and a
// test without it fails, it is never skipped.
package chtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/tollgate/tollgate/internal/testutil"
)

const (
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
)

// Server is a clickhouse-server process owned by one test. Its methods must
// be called from the test's goroutine (they fail the test on error).
type Server struct {
	t        testing.TB
	dir      string
	tcpPort  int
	httpPort int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	paused bool
}

// Start starts a server in a fresh temporary directory and stops it when the
// test ends. It fails the test if ClickHouse is not installed or does not
// come up within a minute.
func Start(t testing.TB) *Server {
	t.Helper()
	serverArgs(t) // fail early and clearly when the binary is missing
	s := &Server{t: t, dir: t.TempDir()}
	t.Cleanup(s.stopQuietly)
	// Ports are picked free, but another process can take one before the
	// server binds it; new ports then are as good as the old ones.
	for attempt := 1; ; attempt++ {
		s.configure()
		err := s.launch()
		if err == nil {
			return s
		}
		if attempt == 3 || !s.portClash() {
			t.Fatalf("chtest: %v", err)
		}
		for _, name := range []string{"config.xml", "ports", "log/clickhouse-server.err.log", "log/stdout.log"} {
			_ = os.Remove(filepath.Join(s.dir, name))
		}
	}
}

// DSN is the native-protocol address of the server's default database.
func (s *Server) DSN() string {
	return fmt.Sprintf("clickhouse://127.0.0.1:%d/default", s.tcpPort)
}

// Addr is host:port of the native protocol.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.tcpPort) }

// HTTPPort is the port of ClickHouse's HTTP interface.
func (s *Server) HTTPPort() int { return s.httpPort }

// Dir holds the server's config, data and logs (log/).
func (s *Server) Dir() string { return s.dir }

// Stop shuts the server down gracefully and waits until it has exited;
// clients then get connection refused. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.t.Helper()
	if err := s.stop(syscall.SIGTERM); err != nil {
		s.t.Fatalf("chtest: %v", err)
	}
}

// Kill ends the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	s.t.Helper()
	if err := s.stop(syscall.SIGKILL); err != nil {
		s.t.Fatalf("chtest: %v", err)
	}
}

// Restart starts the server again (stopping it first if it runs) with the
// same data and ports, and waits until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.launch(); err != nil {
		s.t.Fatalf("chtest: restarting: %v", err)
	}
}

// Pause freezes the server (SIGSTOP): connections stay open and every
// request hangs, as with a server that is overloaded or cut off by a
// network partition. Resume undoes it.
func (s *Server) Pause() { s.signalPause(syscall.SIGSTOP, true) }

// Resume continues a paused server.
func (s *Server) Resume() { s.signalPause(syscall.SIGCONT, false) }

func (s *Server) signalPause(sig syscall.Signal, paused bool) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("chtest: %v: the server is not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("chtest: %v: %v", sig, err)
	}
	s.paused = paused
}

// Query runs sql (several statements allowed, separated by ';') with
// clickhouse-client, the tool finance uses, and returns its output as
// tab-separated rows. It fails t if the client fails.
func (s *Server) Query(t testing.TB, sql string) string {
	t.Helper()
	name, args := clientArgs(t)
	args = append(args, "--host", "127.0.0.1", "--port", strconv.Itoa(s.tcpPort), "--multiquery")
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(sql)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chtest: clickhouse-client: %v\n%s\nquery:\n%s", err, strings.TrimSpace(stderr.String()), sql)
	}
	return stdout.String()
}

// configure writes the config into s.dir unless it is there and reads the
// ports from it.
func (s *Server) configure() {
	s.t.Helper()
	cmd := exec.Command("bash", scriptPath(s.t), "config", s.dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("chtest: scripts/clickhouse.sh config: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		key, value, _ := strings.Cut(line, "=")
		port, _ := strconv.Atoi(value)
		switch key {
		case "CLICKHOUSE_TCP_PORT":
			s.tcpPort = port
		case "CLICKHOUSE_HTTP_PORT":
			s.httpPort = port
		}
	}
	if s.tcpPort == 0 || s.httpPort == 0 {
		s.t.Fatalf("chtest: scripts/clickhouse.sh config printed no ports:\n%s", out)
	}
}

// launch starts the process and waits until it answers a ping.
func (s *Server) launch() error {
	name, args := serverArgs(s.t)
	args = append(args, "--config-file="+filepath.Join(s.dir, "config.xml"))
	logFile, err := os.OpenFile(filepath.Join(s.dir, "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening server log: %w", err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = testutil.DieWithParent()
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited, s.paused = cmd, exited, false
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("clickhouse-server exited during startup:\n%s", s.logTail())
		default:
		}
		if err := s.ping(); err == nil {
			s.t.Logf("chtest: clickhouse-server up on %s in %v", s.Addr(), time.Since(began).Round(time.Millisecond))
			return nil
		} else if time.Now().After(deadline) {
			_ = s.stop(syscall.SIGKILL)
			return fmt.Errorf("clickhouse-server did not answer within %v: %v\n%s", startTimeout, err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{s.Addr()},
		DialTimeout: time.Second,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Ping(ctx)
}

func (s *Server) stop(sig syscall.Signal) error {
	s.mu.Lock()
	cmd, exited, paused := s.cmd, s.exited, s.paused
	s.cmd, s.paused = nil, false
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling clickhouse-server: %w", err)
	}
	if paused {
		// A stopped process acts on SIGTERM only once it runs again.
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("clickhouse-server ignored %v for %v and was killed", sig, stopTimeout)
	}
}

// stopQuietly ends the server when the test is over. SIGKILL: nothing in
// it is needed any more, and a graceful shutdown takes about a second.
func (s *Server) stopQuietly() {
	if err := s.stop(syscall.SIGKILL); err != nil {
		s.t.Errorf("chtest: %v", err)
	}
}

func (s *Server) portClash() bool {
	return strings.Contains(s.logTail(), "Address already in use")
}

// logTail returns the last lines of the server's error and stdout logs.
func (s *Server) logTail() string {
	var b strings.Builder
	for _, name := range []string{"clickhouse-server.err.log", "stdout.log"} {
		data, err := os.ReadFile(filepath.Join(s.dir, "log", name))
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s:\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}

// serverArgs and clientArgs return the command for this machine: Debian's
// 18.16 ships clickhouse-server and clickhouse-client, current releases one
// clickhouse binary with subcommands.
func serverArgs(t testing.TB) (string, []string) { return binary(t, "clickhouse-server", "server") }
func clientArgs(t testing.TB) (string, []string) { return binary(t, "clickhouse-client", "client") }

func binary(t testing.TB, name, subcommand string) (string, []string) {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path, nil
	}
	if path, err := exec.LookPath("clickhouse"); err == nil {
		return path, []string{subcommand}
	}
	t.Fatalf("chtest: %s is not installed: run `make test`, or scripts/clickhouse.sh install", name)
	return "", nil
}

// scriptPath finds scripts/clickhouse.sh in the module this package is part
// of: beside the source file when it is known, else above the working
// directory (go test runs in the package's directory).
func scriptPath(t testing.TB) string {
	t.Helper()
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, dir := range starts {
		for ; ; dir = filepath.Dir(dir) {
			candidate := filepath.Join(dir, "scripts", "clickhouse.sh")
			if isModuleRoot(dir) {
				if _, err := os.Stat(candidate); err == nil {
					return candidate
				}
				break
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	t.Fatalf("chtest: scripts/clickhouse.sh not found above %v", starts)
	return ""
}

func isModuleRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	return scanner.Scan() && strings.TrimSpace(scanner.Text()) == "module github.com/tollgate/tollgate"
}
