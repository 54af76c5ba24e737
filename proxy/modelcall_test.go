package proxy_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

const modelCallBody = `{"model":"small","messages":[{"role":"user","content":"hi"}]}`

// A plugin's model call takes the same attempts as client traffic: an
// upstream that refuses the connection is passed over for the next.
func TestCallModelRetriesOnAnotherUpstream(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin")
	h.ups[0].Close()
	for i := range 4 {
		body, usage, err := h.gw.World().CallModel(context.Background(), "small", []byte(modelCallBody))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if !strings.Contains(string(body), `"choices"`) || usage.PromptTokens == 0 {
			t.Fatalf("call %d: body %s, usage %+v", i, body, usage)
		}
	}
}

// An answer cut before its Content-Length is an unavailable model, never
// a short body handed to the engine as if it were the answer.
func TestCallModelCutAnswerIsAnError(t *testing.T) {
	cut := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"choices\":[{\"message\""))
		return false
	})
	h := newPoolHarness(t, 1, "  retries: 0")
	// p0 moves to the cutting server; setPool reads only its upstreams' URLs.
	h.ups = []*proxytest.Server{{URL: cut}}
	h.setPool("  retries: 0\n  eject_after: 5", "p0")
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		if _, _, err := h.gw.World().CallModel(context.Background(), "small", []byte(modelCallBody)); err == nil {
			return errors.New("the old p0 still answers")
		}
		return nil
	})
	_, _, err := h.gw.World().CallModel(context.Background(), "small", []byte(modelCallBody))
	if !errors.Is(err, proxy.ErrModelUnavailable) || !strings.Contains(err.Error(), "reading its response") {
		t.Fatalf("cut answer: %v; want ErrModelUnavailable saying the response was cut", err)
	}
}

// A classifier engine's model call waits first_byte_timeout, not the
// response_timeout of a client's non-streamed generation: its caller
// falls back to the offline engine, and once waited ten minutes to.
func TestCallModelWaitsFirstByteTimeout(t *testing.T) {
	slow := proxytest.Options{FirstByteDelay: 3 * time.Second}
	h := newPoolHarness(t, 1, "  retries: 0", slow)
	h.writeConfig(strings.ReplaceAll(readFile(t, h.cfgPath), "first_byte_timeout: 2s}", "first_byte_timeout: 200ms, response_timeout: 10m}"))
	began := time.Now()
	_, _, err := h.gw.World().CallModel(context.Background(), "small", []byte(modelCallBody))
	if !errors.Is(err, proxy.ErrModelUnavailable) || !strings.Contains(err.Error(), "first_byte_timeout") {
		t.Fatalf("err %v, want the model unavailable after first_byte_timeout", err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("the engine's call took %v; first_byte_timeout is 200ms", took)
	}
}

// An upstream's error body quoted in the message is cut between
// characters: cut inside one, the plugin's JSON error carried invalid
// UTF-8.
func TestModelErrorQuotesBodyBetweenCharacters(t *testing.T) {
	body := strings.Repeat("a", 199) + strings.Repeat("€", 10)
	msg := (&proxy.ModelError{Status: 500, Body: []byte(body)}).Error()
	if !utf8.ValidString(msg) {
		t.Fatalf("message is not valid UTF-8: %q", msg)
	}
	if !strings.HasSuffix(msg, strings.Repeat("a", 199)+"…") {
		t.Fatalf("message %q, want the body cut after the a's", msg)
	}
}

// A success status whose body is an error is the upstream's failure for
// a classifier engine's call too: another upstream answers it. It was
// handed to the engine as an answer, which asked again up to four times,
// each billed.
func TestCallModelErrorBodyWithSuccessStatusMovesOn(t *testing.T) {
	failing := proxytest.Options{Status: 200, ErrorBody: `{"error":{"message":"model overloaded","type":"server_error"}}`}
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin", failing)
	for i := range 4 {
		body, _, err := h.gw.World().CallModel(context.Background(), "small", []byte(modelCallBody))
		if err != nil || !strings.Contains(string(body), `"choices"`) {
			t.Fatalf("call %d: %v, body %s", i, err, body)
		}
	}
}

// Such an error that blames the request is the upstream's own 4xx, which
// the llm engine reads: a refusal of logprobs is asked again without.
func TestCallModelErrorBodyBlamingTheRequestIsAModelError(t *testing.T) {
	refusing := proxytest.Options{Status: 200, ErrorBody: `{"error":{"message":"logprobs are not supported","type":"invalid_request_error","param":"logprobs"}}`}
	h := newPoolHarness(t, 1, "  retries: 1", refusing)
	_, _, err := h.gw.World().CallModel(context.Background(), "small", []byte(modelCallBody))
	var me *proxy.ModelError
	if !errors.As(err, &me) || me.Status != 400 || !strings.Contains(err.Error(), "answered 400") || !strings.Contains(err.Error(), "logprobs") {
		t.Fatalf("got %v; want a ModelError 400 quoting the upstream", err)
	}
}
