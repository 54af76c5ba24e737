package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// readyz is what GET (or HEAD) url answers: its status, its reasons
// when not ready, and its body.
type readyz struct {
	status  int
	reasons []string
	body    string
}

func getReadyz(t *testing.T, method, url string) readyz {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	r := readyz{status: resp.StatusCode, body: string(body)}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("%s %s: Cache-Control %q, want no-store", method, url, cc)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, url, ct)
	}
	if method == http.MethodHead {
		if len(body) != 0 {
			t.Errorf("HEAD %s: a body, %q", url, body)
		}
		return r
	}
	var v struct {
		Status  string   `json:"status"`
		Reasons []string `json:"reasons"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s %s: %d %q: %v", method, url, resp.StatusCode, body, err)
	}
	r.reasons = v.Reasons
	switch {
	case r.status == http.StatusOK && string(body) != `{"status":"ready"}`,
		r.status == http.StatusServiceUnavailable && (v.Status != "not_ready" || len(v.Reasons) == 0),
		r.status != http.StatusOK && r.status != http.StatusServiceUnavailable:
		t.Errorf("%s %s: %d %s", method, url, r.status, body)
	}
	return r
}

// There was no readiness endpoint: /healthz says the process answers,
// and a load balancer or Kubernetes kept sending calls to a gateway
// shutting down, or one whose listener was not served yet. /readyz, on
// the public listener and on server.metrics_listen, says 503 from the
// moment a SIGTERM's drain begins, with the stream still open, while
// /healthz stays 200.
func TestReadyzSaysNotReadyBeforeServingAndFromTheDrainsStart(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{
		NoListen: true,
		Upstream: &proxytest.Options{Chunks: 600, ChunkDelay: 50 * time.Millisecond},
		Config: func(upstream, dir string) string {
			return smallModelConfig(upstream, dir, "  metrics_listen: 127.0.0.1:0\n", "")
		},
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serveMetrics(ln, g.Server, t.Logf)
	private := "http://" + ln.Addr().String()

	if r := getReadyz(t, http.MethodGet, private+"/readyz"); r.status != http.StatusServiceUnavailable || !slices.Equal(r.reasons, []string{"starting: not serving calls yet"}) {
		t.Errorf("/readyz before the public listener is served: %d %s", r.status, r.body)
	}
	public := gatewaytest.Serve(t, g.Server)
	for _, url := range []string{public, private} {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			if r := getReadyz(t, method, url+"/readyz"); r.status != http.StatusOK {
				t.Errorf("%s %s/readyz serving: %d %s", method, url, r.status, r.body)
			}
		}
	}

	br := startStream(t, g, public)

	again := make(chan os.Signal, 1)
	stopped := make(chan struct{})
	go func() { shutDown(g.Server, time.Minute, again, t.Logf); close(stopped) }()
	testutil.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
		if r := getReadyz(t, http.MethodGet, private+"/readyz"); r.status != http.StatusServiceUnavailable {
			return fmt.Errorf("/readyz in the drain: %d %s", r.status, r.body)
		}
		return nil
	})
	if r := getReadyz(t, http.MethodGet, private+"/readyz"); !slices.Equal(r.reasons, []string{"draining: shutting down"}) {
		t.Errorf("/readyz in the drain: reasons %q", r.reasons)
	}
	select {
	case <-stopped:
		t.Fatal("the drain ended before the stream did")
	default:
	}
	if line, err := br.ReadString('\n'); err != nil || strings.Contains(line, "stream_interrupted") {
		t.Fatalf("the stream in the drain: %q, %v; want it still relayed", line, err)
	}
	hz, err := http.Get(private + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	hz.Body.Close()
	if hz.StatusCode != http.StatusOK {
		t.Errorf("/healthz in the drain: %d, want 200 (liveness)", hz.StatusCode)
	}

	again <- os.Interrupt
	_, _ = io.Copy(io.Discard, br)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the shutdown still waits 10 s after the second Ctrl-C")
	}
}
