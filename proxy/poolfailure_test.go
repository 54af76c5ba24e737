package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stuckEngine is a vLLM whose engine is stuck: its API server answers
// GET /models, and, once stuck, takes every generation call and never
// answers it. Before that it answers calls at once.
type stuckEngine struct {
	URL   string
	stuck atomic.Bool
	posts atomic.Int32 // generation calls it got
}

func newStuckEngine(t *testing.T) *stuckEngine {
	t.Helper()
	s := &stuckEngine{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"proxytest-small","object":"model"}]}`))
			return
		}
		s.posts.Add(1)
		_, _ = io.Copy(io.Discard, r.Body) // read, the server sees the gateway close the connection
		if s.stuck.Load() {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c","object":"chat.completion","model":"proxytest-small","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	s.URL = srv.URL + "/v1"
	return s
}

// withStuckEngine is a pool of two: p0 a stuckEngine, timed out after
// 300 ms streamed or not, and p1 a healthy proxytest upstream.
func withStuckEngine(t *testing.T, routing string) (*poolHarness, *stuckEngine) {
	t.Helper()
	h := newPoolHarness(t, 2, routing)
	s := newStuckEngine(t)
	cfg := readFile(t, h.cfgPath)
	cfg = strings.Replace(cfg, "base_url: "+h.ups[0].URL+", first_byte_timeout: 2s}",
		"base_url: "+s.URL+", first_byte_timeout: 300ms, response_timeout: 300ms}", 1)
	h.writeConfig(cfg)
	// Both answered, so slow start holds neither back.
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if resp := h.post("/v1/chat/completions", smallChat); resp.StatusCode != 200 {
			return fmt.Errorf("warm-up call: %d %s", resp.StatusCode, readAll(t, resp))
		} else {
			readAll(t, resp)
		}
		if s.posts.Load() == 0 || len(h.ups[1].Requests()) == 0 {
			return fmt.Errorf("p0 got %d calls, p1 %d", s.posts.Load(), len(h.ups[1].Requests()))
		}
		return nil
	})
	s.stuck.Store(true)
	return h, s
}

// untilStuckCall sends calls until one goes to the stuck p0 and times
// out, and returns its status.
func untilStuckCall(t *testing.T, h *poolHarness, s *stuckEngine) {
	t.Helper()
	before := s.posts.Load()
	for i := 0; s.posts.Load() == before; i++ {
		if i == 50 {
			t.Fatal("50 calls and none went to p0")
		}
		resp := h.post("/v1/chat/completions", smallChat)
		body := readAll(t, resp)
		if s.posts.Load() != before && resp.StatusCode != 504 {
			t.Fatalf("the call p0 held: %d %s, want the 504 of response_timeout", resp.StatusCode, body)
		}
	}
}

// A call that timed out enters its member's latency with its wait: a
// member whose engine is stuck, but whose API server answers, looked
// idle and fast after each timeout (latency_ms 0.01 against its healthy
// peer's 0.6), and p2c sent it call after call, each waiting the whole
// response_timeout for a 504.
func TestPoolTimedOutCallMakesItsMemberDear(t *testing.T) {
	h, s := withStuckEngine(t, "  balance: p2c\n  eject_after: 3")
	untilStuckCall(t, h, s)
	held := s.posts.Load()
	for i := range 10 {
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("call %d after the timeout: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := s.posts.Load() - held; n != 0 {
		t.Fatalf("%d of the 10 calls after the timeout went to the member that timed out, want none", n)
	}
}

// A trial that times out is a failed trial: the ejection doubles and the
// probe, which the stuck member's API server answers, no longer ends it.
// It left the probe running: every probe_interval the member was back
// for a trial that held a call for response_timeout, for good.
func TestPoolTrialThatTimesOutDoublesTheEjection(t *testing.T) {
	h, s := withStuckEngine(t, "  balance: p2c\n  eject_after: 1\n  eject_for: 1s\n  eject_max: 30s\n  probe_interval: 100ms")
	untilStuckCall(t, h, s)
	if st := h.statuses()["p0"]; st.State != "ejected" || st.Ejections != 1 {
		t.Fatalf("p0 after its timeout: %+v, want ejected once", st)
	}
	// Its probe answers: the next call to it is the trial.
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		if st := h.statuses()["p0"]; st.State != "half_open" {
			return fmt.Errorf("p0 is %s, want half_open once its probe answered", st.State)
		}
		return nil
	})
	untilStuckCall(t, h, s)
	trialEnded := time.Now()
	time.Sleep(500 * time.Millisecond) // five probe intervals
	st := h.statuses()["p0"]
	if st.State != "ejected" || st.Ejections != 2 {
		t.Fatalf("p0 500 ms after its trial timed out: %+v, want ejected a second time, its probe no longer ending that", st)
	}
	until, err := time.Parse(time.RFC3339Nano, st.EjectedUntil)
	if err != nil {
		t.Fatal(err)
	}
	if d := until.Sub(trialEnded); d < 1500*time.Millisecond {
		t.Fatalf("ejected for %s after the failed trial, want twice eject_for (2s)", d.Round(time.Millisecond))
	}
}
