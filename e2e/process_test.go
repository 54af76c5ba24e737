package e2e

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor

// freeAddr returns 127.0.0.1:<port> of a port free right now. Another
// process may take it before the child binds it; on a test machine that is
// rare enough to accept.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// process is a child running the tollgate binary. Its output (stdout and
// stderr, across restarts) goes to a log file that is printed when the test
// fails.
type process struct {
	t       *testing.T
	bin     string // default tollgateBin
	name    string
	args    []string
	env     []string
	dir     string
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// envPrefixes are the variables gateway.yaml reads; the developer's own
// values must not leak into a child.
var envPrefixes = []string{"TOLLGATE_", "UPSTREAM_", "NATS_", "CLICKHOUSE_", "S3_"}

func newProcess(t *testing.T, name, workDir string, env map[string]string, args ...string) *process {
	t.Helper()
	var merged []string
	for _, kv := range os.Environ() {
		inherited := true
		for _, p := range envPrefixes {
			if strings.HasPrefix(kv, p) {
				inherited = false
			}
		}
		if inherited {
			merged = append(merged, kv)
		}
	}
	for k, v := range env {
		merged = append(merged, k+"="+v)
	}
	if err := os.MkdirAll(workDir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := &process{t: t, name: name, args: args, env: merged, dir: workDir,
		logPath: filepath.Join(workDir, name+".log")}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- %s output (last lines of %s):\n%s", p.name, p.logPath, p.logTail(120))
		}
	})
	return p
}

// start launches the process; it must not be running.
func (p *process) start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatalf("%s: started while running", p.name)
	}
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	defer logFile.Close() // the child holds its own descriptor
	fmt.Fprintf(logFile, "=== %s: starting %s %s\n", time.Now().Format(time.TimeOnly), p.name, strings.Join(p.args, " "))
	cmd := exec.Command(cmp.Or(p.bin, tollgateBin), p.args...)
	cmd.Dir = p.dir
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = testutil.DieWithParent()
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("starting %s: %v", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		killed := p.cmd != cmd
		p.mu.Unlock()
		if !killed {
			p.t.Errorf("%s exited on its own: %v", p.name, err)
		}
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
}

// kill ends the process with SIGKILL, as a crash or an OOM kill would, and
// waits until it is gone. Killing a stopped process does nothing.
func (p *process) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Errorf("killing %s: %v", p.name, err)
	}
	<-exited
}

// terminate sends SIGTERM, as an orchestrator stopping the process does,
// and returns a channel closed when the process has exited.
func (p *process) terminate() <-chan struct{} {
	p.t.Helper()
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil // its exit is expected
	p.mu.Unlock()
	if cmd == nil {
		p.t.Fatalf("%s: SIGTERM while not running", p.name)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("%s: SIGTERM: %v", p.name, err)
	}
	return exited
}

// signal sends sig to the running process (SIGSTOP and SIGCONT to freeze
// it at a chosen moment).
func (p *process) signal(sig os.Signal) {
	p.t.Helper()
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		p.t.Fatalf("%s: %v while not running", p.name, sig)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: %v: %v", p.name, sig, err)
	}
}

// freeze stops the process (SIGSTOP) and returns once it is stopped, so
// what it wrote can be read while it writes nothing more.
func (p *process) freeze() {
	p.t.Helper()
	p.signal(syscall.SIGSTOP)
	checkFor(p.t, 5*time.Second, 50*time.Microsecond, func() error { return isStopped(p.pid()) })
}

// step lets a frozen process run for about d and freezes it again.
func (p *process) step(d time.Duration) {
	p.t.Helper()
	p.signal(syscall.SIGCONT)
	time.Sleep(d)
	p.freeze()
}

func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether the process has been started and not exited.
func (p *process) running() bool {
	p.mu.Lock()
	exited := p.exited
	started := p.cmd != nil
	p.mu.Unlock()
	if !started {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// gatewayOptions configure one `tollgate serve`.
type gatewayOptions struct {
	name string
	// config is the file TOLLGATE_CONFIG names; default the repository's
	// gateway.yaml.
	config         string
	upstreamURL    string
	clickhouseDSN  string
	natsURL        string // empty: the embedded server
	consumeInServe bool
	adminToken     string
	// beforeStart runs once, after the data dir exists and before the first
	// start (to install a shared signing key).
	beforeStart func(dataDir string)
}

// gateway is a `tollgate serve` child on loopback ports that stay the same
// across restarts, with its data dir.
type gateway struct {
	*process
	addr       string // public API, host:port
	natsAddr   string // embedded NATS, host:port
	dataDir    string
	adminToken string
	client     *http.Client
}

func startGateway(t *testing.T, o gatewayOptions) *gateway {
	t.Helper()
	if o.config == "" {
		o.config = filepath.Join(repoRoot, "gateway.yaml")
	}
	work := filepath.Join(t.TempDir(), o.name)
	g := &gateway{
		addr:       freeAddr(t),
		natsAddr:   freeAddr(t),
		dataDir:    filepath.Join(work, "data"),
		adminToken: o.adminToken,
		client:     &http.Client{Timeout: 10 * time.Second},
	}
	if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if o.beforeStart != nil {
		o.beforeStart(g.dataDir)
	}
	g.process = newProcess(t, o.name, work, map[string]string{
		"TOLLGATE_CONFIG":           o.config,
		"TOLLGATE_LISTEN":           g.addr,
		"TOLLGATE_DATA_DIR":         g.dataDir,
		"TOLLGATE_ADMIN_TOKEN":      o.adminToken,
		"TOLLGATE_NATS_LISTEN":      g.natsAddr,
		"TOLLGATE_STORAGE_LISTEN":   freeAddr(t),
		"TOLLGATE_CONSUME_IN_SERVE": strconv.FormatBool(o.consumeInServe),
		"UPSTREAM_BASE_URL":         o.upstreamURL,
		"NATS_URL":                  o.natsURL,
		"CLICKHOUSE_DSN":            o.clickhouseDSN,
	}, "serve")
	g.restart()
	return g
}

// restart starts the gateway again on the same ports and data dir and
// waits until it answers /healthz.
func (g *gateway) restart() {
	g.t.Helper()
	began := time.Now()
	g.start()
	checkFor(g.t, 60*time.Second, 20*time.Millisecond, func() error {
		if !g.running() {
			return fmt.Errorf("%s exited while starting:\n%s", g.name, g.logTail(40))
		}
		resp, err := g.client.Get(g.url("/healthz"))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s /healthz: %s", g.name, resp.Status)
		}
		return nil
	})
	g.t.Logf("%s up on %s in %v", g.name, g.addr, time.Since(began).Round(time.Millisecond))
}

func (g *gateway) url(path string) string { return "http://" + g.addr + path }

// admin calls the admin API and decodes the answer into out (may be nil),
// failing the test unless the status is want.
func (g *gateway) admin(method, path string, body any, want int, out any) {
	g.t.Helper()
	status, data := g.adminCall(method, path, body)
	if status != want {
		g.t.Fatalf("%s %s %s: status %d, want %d: %s", g.name, method, path, status, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			g.t.Fatalf("%s %s %s: decoding %s: %v", g.name, method, path, data, err)
		}
	}
}

func (g *gateway) adminCall(method, path string, body any) (int, []byte) {
	g.t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			g.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, g.url(path), rd)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		g.t.Fatalf("%s %s %s: %v", g.name, method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatalf("%s %s %s: reading the answer: %v", g.name, method, path, err)
	}
	return resp.StatusCode, data
}

// outboxDepth reads tollgate_outbox_depth from /metrics.
func (g *gateway) outboxDepth() (int64, error) {
	resp, err := g.client.Get(g.url("/metrics"))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "tollgate_outbox_depth "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s /metrics has no tollgate_outbox_depth:\n%s", g.name, data)
}

// startBilling starts a `tollgate billing` child. configPath must give the
// same nats.replicas as the gateways': billing declares the streams and
// buckets too, with its own replica count.
func startBilling(t *testing.T, name, configPath, natsURL, natsListen, clickhouseDSN string) *process {
	t.Helper()
	if configPath == "" {
		configPath = filepath.Join(repoRoot, "gateway.yaml")
	}
	work := filepath.Join(t.TempDir(), name)
	p := newProcess(t, name, work, map[string]string{
		"TOLLGATE_CONFIG":      configPath,
		"TOLLGATE_DATA_DIR":    filepath.Join(work, "data"),
		"TOLLGATE_NATS_LISTEN": natsListen,
		"NATS_URL":             natsURL,
		"CLICKHOUSE_DSN":       clickhouseDSN,
	}, "billing")
	p.start()
	return p
}
