package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// TestSIGTERMEndsOpenStreamsBilled stops a gateway with SIGTERM while a
// stream longer than server.shutdown_timeout is being relayed. At the
// timeout the stream must end with the stream_interrupted event and be
// billed on estimated usage, and the process must exit soon after: an
// orchestrator's SIGKILL (Kubernetes sends it 30 s after SIGTERM by
// default) would drop such a stream unbilled, which is why the timeout is
// a setting.
func TestSIGTERMEndsOpenStreamsBilled(t *testing.T) {
	t.Parallel()
	ch := chtest.Start(t)
	// 600 chunks 50 ms apart: a 30 s stream.
	up := proxytest.NewServer(proxytest.Options{Chunks: 600, ChunkDelay: 50 * time.Millisecond, NoRecord: true})
	t.Cleanup(up.Close)
	const timeout = 2 * time.Second
	gw := startGateway(t, gatewayOptions{
		name:           "sigterm",
		config:         writeConfig(t, map[string]yamlScalar{"server.shutdown_timeout": {timeout.String(), "!!str"}}),
		upstreamURL:    up.URL,
		clickhouseDSN:  ch.DSN(),
		consumeInServe: true,
		adminToken:     "tga-e2e-sigterm-admin",
	})
	const account = "sigterm"
	_, key := newAccount(t, gw, account, "5.00")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := `{"model":"` + loadModel + `","stream":true,"messages":[{"role":"user","content":"Tell me a long story"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw.url("/v1/chat/completions"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	rd := bufio.NewReader(resp.Body)
	for range 3 { // a few content events, so the client holds part of an answer
		if _, err := rd.ReadBytes('\n'); err != nil {
			t.Fatal(err)
		}
	}

	began := time.Now()
	exited := gw.terminate()
	rest, err := io.ReadAll(rd)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading the stream after SIGTERM: %v", err)
	}
	ended := time.Since(began)
	if !bytes.Contains(rest, []byte(`"stream_interrupted"`)) || bytes.Contains(rest, []byte("[DONE]")) {
		t.Errorf("after SIGTERM the stream ended without the stream_interrupted event (or with [DONE]); its last bytes: %q", rest[max(0, len(rest)-300):])
	}
	select {
	case <-exited:
	case <-time.After(timeout + 15*time.Second):
		t.Fatalf("the gateway still runs %v after SIGTERM:\n%s", time.Since(began).Round(time.Second), gw.logTail(20))
	}
	t.Logf("stream ended %v after SIGTERM (shutdown_timeout %v); process exited %v after it", ended.Round(time.Millisecond), timeout, time.Since(began).Round(time.Millisecond))
	if ended > timeout+10*time.Second {
		t.Errorf("the stream ended %v after SIGTERM: server.shutdown_timeout %v was not honoured", ended, timeout)
	}

	gw.restart()
	l := openLedger(t, ch.DSN(), "nats://"+gw.natsAddr)
	l.settle(gw)
	events := l.events(account)
	if len(events) != 1 {
		t.Fatalf("%d usage events for the interrupted stream, want 1: %v", len(events), events)
	}
	for id, e := range events {
		if e.source != "estimated" || e.completion <= 0 || e.cost <= 0 {
			t.Errorf("event %s: %+v; want estimated usage with completion tokens and a cost", id, e)
		}
	}
}
