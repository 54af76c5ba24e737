package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	upstreamBinOnce sync.Once
	upstreamBin     string
	upstreamBinErr  error
)

// buildUpstream builds the fake upstream, ./cmd/tollgate-upstream, once.
func buildUpstream(t *testing.T) string {
	t.Helper()
	upstreamBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-e2e-upstream-")
		if err != nil {
			upstreamBinErr = err
			return
		}
		upstreamBin = filepath.Join(dir, "tollgate-upstream")
		cmd := exec.Command("go", "build", "-o", upstreamBin, "./cmd/tollgate-upstream")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			upstreamBinErr = fmt.Errorf("go build ./cmd/tollgate-upstream: %v\n%s", err, out)
		}
	})
	if upstreamBinErr != nil {
		t.Fatal(upstreamBinErr)
	}
	return upstreamBin
}

// upstreamProcess is a tollgate-upstream child on a fixed address.
type upstreamProcess struct {
	*process
	addr string
}

func startUpstreamProcess(t *testing.T, name string) *upstreamProcess {
	t.Helper()
	u := &upstreamProcess{addr: freeAddr(t)}
	u.process = newProcess(t, name, filepath.Join(t.TempDir(), name), nil, "-addr", u.addr, "-chunks", "8")
	u.bin = buildUpstream(t)
	u.up()
	return u
}

// up starts the upstream and waits until it answers.
func (u *upstreamProcess) up() {
	u.t.Helper()
	u.start()
	checkFor(u.t, 20*time.Second, 10*time.Millisecond, func() error {
		resp, err := http.Get("http://" + u.addr + "/v1/models")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
}

const poolConfig = `
server:
  listen: ${TOLLGATE_LISTEN}
  data_dir: ${TOLLGATE_DATA_DIR}
  admin_token: ${TOLLGATE_ADMIN_TOKEN}
  demo_credit_usd: "0"
nats:
  embedded_listen: ${TOLLGATE_NATS_LISTEN}
clickhouse:
  consume_in_serve: false
storage:
  local:
    listen: ${TOLLGATE_STORAGE_LISTEN}
routing:
  eject_for: 1s
  probe_interval: 500ms
upstreams:
  - {name: u1, base_url: "http://%s/v1", first_byte_timeout: 5s}
  - {name: u2, base_url: "http://%s/v1", first_byte_timeout: 5s}
  - {name: u3, base_url: "http://%s/v1", first_byte_timeout: 5s}
models:
  - id: pooled
    upstreams: [u1, u2, u3]
    upstream_model: proxytest-small
    context_length: 100000
    max_output_length: 1000
    pricing: {prompt: "0.0000001", completion: "0.0000002"}
`

type upstreamStatus struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Calls     uint64 `json:"calls"`
	InFlight  int64  `json:"in_flight"`
	Ejections uint64 `json:"ejections"`
}

func (g *gateway) upstreams() map[string]upstreamStatus {
	g.t.Helper()
	var out struct {
		Data []upstreamStatus `json:"data"`
	}
	g.admin("GET", "/admin/v1/upstreams", nil, 200, &out)
	m := map[string]upstreamStatus{}
	for _, s := range out.Data {
		m[s.Name] = s
	}
	return m
}

// TestPoolSurvivesUpstreamSIGKILL runs steady non-streamed load against a
// model served by three upstream processes, SIGKILLs one and starts it
// again: no call fails, the load is spread while all are up, and the
// restarted upstream gets calls again soon after it is back.
func TestPoolSurvivesUpstreamSIGKILL(t *testing.T) {
	ups := []*upstreamProcess{startUpstreamProcess(t, "u1"), startUpstreamProcess(t, "u2"), startUpstreamProcess(t, "u3")}
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, poolConfig, ups[0].addr, ups[1].addr, ups[2].addr), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, gatewayOptions{name: "gateway", config: cfg, adminToken: "tga-pool-test-admin"})
	_, key := newAccount(t, g, "pool", "100")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	// repeat runs call in n goroutines until stop closes.
	repeat := func(n int, call func()) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						call()
					}
				}
			}()
		}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	chat := func(stream bool) (*http.Response, error) {
		body := fmt.Sprintf(`{"model":"pooled","stream":%t,"messages":[{"role":"user","content":"hi"}]}`, stream)
		req, _ := http.NewRequest("POST", g.url("/v1/chat/completions"), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil && resp.StatusCode != 200 {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			err = fmt.Errorf("status %d: %s", resp.StatusCode, body)
		}
		return resp, err
	}

	var calls, failures atomic.Int64
	var firstFailure atomic.Value
	repeat(8, func() {
		resp, err := chat(false)
		calls.Add(1)
		if err != nil {
			failures.Add(1)
			firstFailure.CompareAndSwap(nil, err.Error())
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	})
	// Streams too: one cut because its upstream was killed after it began
	// is allowed (its client saw the error event); one that fails before
	// its first byte is not, since the gateway could still move it.
	var streams, streamsCut, streamsFailed atomic.Int64
	var firstStreamFailure atomic.Value
	repeat(4, func() {
		streams.Add(1)
		resp, err := chat(true)
		if err != nil {
			streamsFailed.Add(1)
			firstStreamFailure.CompareAndSwap(nil, err.Error())
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !strings.HasSuffix(strings.TrimSpace(string(body)), "data: [DONE]") {
			streamsCut.Add(1)
		}
	})
	defer func() { close(stop); wg.Wait() }()

	// All up: each upstream carries at least a fifth of the calls.
	before := g.upstreams()
	time.Sleep(3 * time.Second)
	after := g.upstreams()
	var total uint64
	for _, name := range []string{"u1", "u2", "u3"} {
		total += after[name].Calls - before[name].Calls
	}
	if total < 100 {
		t.Fatalf("only %d calls in 3 s", total)
	}
	for _, name := range []string{"u1", "u2", "u3"} {
		if got := after[name].Calls - before[name].Calls; got*5 < total {
			t.Errorf("%s took %d of %d calls while all were up, less than a fifth", name, got, total)
		}
	}

	ups[1].kill()
	time.Sleep(3 * time.Second)
	if st := g.upstreams()["u2"]; st.State != "ejected" && st.State != "half_open" {
		t.Errorf("u2 SIGKILLed 3 s ago is %q, want ejected", st.State)
	}
	ups[1].up()
	back := time.Now()
	start := g.upstreams()["u2"].Calls
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if st := g.upstreams()["u2"]; st.Calls < start+10 {
			return fmt.Errorf("u2 restarted %v ago has taken %d calls since, state %s", time.Since(back).Round(time.Millisecond), st.Calls-start, st.State)
		}
		return nil
	})
	t.Logf("u2 took calls again %v after it was back", time.Since(back).Round(time.Millisecond))

	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d calls failed; first: %v", n, calls.Load(), firstFailure.Load())
	}
	t.Logf("%d calls, none failed", calls.Load())
	if n := streamsFailed.Load(); n > 0 {
		t.Fatalf("%d of %d streams failed before their first byte; first: %v", n, streams.Load(), firstStreamFailure.Load())
	}
	t.Logf("%d streams, none failed before its first byte; %d cut after it by the kill", streams.Load(), streamsCut.Load())
	if len(g.upstreams()) != 3 {
		t.Fatalf("admin lists %v, want u1, u2, u3", g.upstreams())
	}
}
