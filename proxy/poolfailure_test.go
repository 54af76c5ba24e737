package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
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
	// p2c may price p0 dearer than p1 for a while (its first answers,
	// on a busy machine): its latency, unsampled, is halved each second.
	for deadline := time.Now().Add(10 * time.Second); s.posts.Load() == before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("none of the calls of 10 s went to p0")
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

// crashingUpstream is a raw HTTP/1.1 upstream that answers generation
// calls on kept-alive connections until told to close: then it reads each
// call whole, counts it, and closes the connection without answering (a
// query of death: the replica crashes on it). GET /models always answers.
type crashingUpstream struct {
	URL     string
	closing atomic.Bool
	calls   atomic.Int32 // generation requests read whole
}

func newCrashingUpstream(t *testing.T) *crashingUpstream {
	t.Helper()
	u := &crashingUpstream{}
	u.URL = "http://" + proxy.ServeConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			body := `{"object":"list","data":[{"id":"proxytest-small","object":"model"}]}`
			if req.Method == "POST" {
				u.calls.Add(1)
				if u.closing.Load() {
					return
				}
				body = `{"id":"c","object":"chat.completion","model":"proxytest-small","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
			}
			if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
				return
			}
		}
	}) + "/v1"
	return u
}

// withCrashingUpstreams serves model small with n crashingUpstreams, p0 …,
// each with a kept-alive connection that has answered.
func withCrashingUpstreams(t *testing.T, n int) (*poolHarness, []*crashingUpstream) {
	t.Helper()
	h := newPoolHarness(t, 2, "  balance: round_robin\n  retries: 2")
	var ups []*crashingUpstream
	cfg := readFile(t, h.cfgPath)
	for i := range 2 {
		u := newCrashingUpstream(t)
		ups = append(ups, u)
		cfg = strings.Replace(cfg, "base_url: "+h.ups[i].URL+",", "base_url: "+u.URL+",", 1)
	}
	if n == 1 {
		cfg = strings.Replace(cfg, "upstreams: [p0, p1]", "upstreams: [p0]", 1)
	}
	h.writeConfig(cfg)
	ups = ups[:n]
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			return fmt.Errorf("warm-up call: %d %s", resp.StatusCode, body)
		}
		for i, u := range ups {
			if u.calls.Load() == 0 {
				return fmt.Errorf("p%d not called yet", i)
			}
		}
		return nil
	})
	return h, ups
}

// An upstream that reads a call whole and closes the connection without
// answering took it: it is not sent the call again, though the call came
// on a kept-alive connection. The connection was looked at when taken
// (idle over 50 ms: rawconn.Quiet), so the close was no stale keep-alive,
// yet it came within a few round trips of the request and the call was
// sent again on a new connection: 2 deliveries for 1 call to a model's
// only upstream, and 2 to each member of a pool of two.
func TestUpstreamThatClosedAfterTakingTheCallIsNotSentItAgain(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("pool of %d", n), func(t *testing.T) {
			h, ups := withCrashingUpstreams(t, n)
			var before []int32
			for _, u := range ups {
				u.closing.Store(true)
				before = append(before, u.calls.Load())
			}
			time.Sleep(100 * time.Millisecond) // past quietCheckIdle: looked at when taken
			resp := h.post("/v1/chat/completions", smallChat)
			if body := readAll(t, resp); resp.StatusCode != 503 {
				t.Fatalf("%d %s, want 503", resp.StatusCode, body)
			}
			for i, u := range ups {
				if got := u.calls.Load() - before[i]; got != 1 {
					t.Errorf("p%d got the call %d times, want once", i, got)
				}
			}
		})
	}
}

// A non-streamed answer cut short (the connection closed after 300 of
// the 1000 bytes its Content-Length announced) reached the client as
// nothing, as a close-delimited body cut short does: both move on to
// another member of the pool. The first was a 502 upstream_response_cut
// at once, no other member tried, while the second, read as JSON that
// does not parse, was retried.
func TestPoolRetriesANonStreamedAnswerCutShort(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin\n  retries: 2\n  eject_after: 100")
	var asked atomic.Int32
	cut := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		asked.Add(1)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":\"c\",\"choices\":[%s", strings.Repeat(" ", 280))
		return false
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "base_url: "+h.ups[0].URL+",", "base_url: "+cut+",", 1))
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		if asked.Load() >= 2 {
			return nil
		}
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%d %s, want p1's answer", resp.StatusCode, body)
		}
		return fmt.Errorf("p0 asked %d times", asked.Load())
	})
	if evs := h.rec.Events(); len(evs) == 0 || evs[len(evs)-1].Upstream != "p1" {
		t.Fatalf("events %+v, want p1's answers billed", evs)
	}
}

// An upstream that took the call and closed the connection without a
// byte of answer is said to have done so, to the client and in
// last_error: it was "is unreachable: it closed the connection" to the
// client and fasthttp's "error when reading response headers: EOF" or a
// bare "EOF" in last_error; and a stream it cut was "unexpected EOF" in
// last_error where its client read that it closed the connection.
func TestUpstreamThatClosedIsSaidToHaveClosed(t *testing.T) {
	h, ups := withCrashingUpstreams(t, 1)
	ups[0].closing.Store(true)
	time.Sleep(100 * time.Millisecond)
	e := wantError(t, h.post("/v1/chat/completions", smallChat), 503, "upstream_unavailable")
	if msg := e["message"].(string); msg != "upstream p0 closed the connection without answering" {
		t.Errorf("message %q", msg)
	}
	if st := h.statuses()["p0"]; st.LastError != "closed the connection without answering" {
		t.Errorf("last_error %q", st.LastError)
	}

	h.ups[0].SetOptions(proxytest.Options{DropAfter: 3})
	cfg := readFile(t, h.cfgPath)
	h.writeConfig(strings.Replace(cfg, "base_url: "+ups[0].URL+",", "base_url: "+h.ups[0].URL+",", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		body := string(readAll(t, h.post("/v1/chat/completions", strings.Replace(smallChat, `{`, `{"stream":true,`, 1))))
		if !strings.Contains(body, "stream_interrupted") {
			return fmt.Errorf("stream %s, want it cut", body)
		}
		if !strings.Contains(body, "upstream p0 stream was interrupted: it closed the connection") {
			t.Fatalf("stream %s", body)
		}
		return nil
	})
	if st := h.statuses()["p0"]; st.LastError != "upstream p0 stream was interrupted: it closed the connection" {
		t.Errorf("last_error %q, want the client's words", st.LastError)
	}
}
