package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// A second Ctrl-C during the shutdown wait ends the open streams at once,
// billed: the second one was dropped, and a gateway relaying a long
// stream waited its whole server.shutdown_timeout (25 s).
func TestSecondCtrlCEndsTheShutdownWait(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{
		Upstream: &proxytest.Options{Chunks: 600, ChunkDelay: 50 * time.Millisecond},
		Config: func(upstream, dir string) string {
			return smallModelConfig(upstream, dir, "  listen: 127.0.0.1:0\n", "")
		},
	})
	br := startStream(t, g, g.URL)

	again := make(chan os.Signal, 1)
	stopped := make(chan struct{})
	start := time.Now()
	go func() { shutDown(g.Server, time.Minute, again, t.Logf); close(stopped) }()
	time.Sleep(200 * time.Millisecond) // in the wait
	again <- os.Interrupt
	rest, _ := io.ReadAll(br)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the shutdown still waits 10 s after the second Ctrl-C")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("shutdown took %s", took)
	}
	if !strings.Contains(string(rest), "stream_interrupted") {
		t.Errorf("the stream did not end with stream_interrupted: ...%s", rest[max(0, len(rest)-300):])
	}
	if evs := g.Recorder.Events(); len(evs) != 1 {
		t.Errorf("%d usage events after the cut, want 1 (billed)", len(evs))
	}
}

// smallModelConfig is the gateway.yaml of a gateway with data_dir dir and
// no demo credit that serves model "small" from upstream, a proxytest
// upstream; server adds lines to its server section, sections adds
// sections of their own.
func smallModelConfig(upstream, dir, server, sections string) string {
	return fmt.Sprintf("server:\n  data_dir: %s\n  demo_credit_usd: \"0\"\n%s%s"+
		"upstreams:\n  - name: local\n    base_url: %s\n"+
		"models:\n  - id: small\n    upstream: local\n    upstream_model: proxytest-small\n    context_length: 32768\n    max_output_length: 4096\n"+
		"    pricing: {prompt: \"0.0000001\", completion: \"0.0000003\"}\n", dir, server, sections, upstream)
}

// postChat posts body to the chat completions of the gateway at url with
// key, and returns the answer, its body for the caller to close.
func postChat(t *testing.T, url, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// startStream opens a chat stream through the gateway at url, for a new
// account of g, and returns its body once the stream has begun; the body
// is closed at the test's end.
func startStream(t *testing.T, g *gatewaytest.Gateway, url string) *bufio.Reader {
	t.Helper()
	g.CreateAccount("acme", money.Nanos(5_000_000_000))
	key := g.CreateKey("acme", accounts.KeyRequest{Name: "k"})
	resp := postChat(t, url, key, `{"model":"small","stream":true,"messages":[{"role":"user","content":"a long story"}]}`)
	t.Cleanup(func() { resp.Body.Close() })
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the stream has begun
		t.Fatal(err)
	}
	return br
}
