package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/meter"
)

// ErrModelUnavailable wraps every failure of CallModel that is not the
// model's own answer: unknown model, upstream down or too slow. Plugins
// answer it with 503 or fall back to an offline engine.
var ErrModelUnavailable = errors.New("model unavailable")

// ModelError is a non-2xx answer of the upstream to CallModel.
type ModelError struct {
	Status int
	Body   []byte
}

func (e *ModelError) Error() string {
	return fmt.Sprintf("upstream answered %d: %s", e.Status, truncate(e.Body, 200))
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// CallModel sends a non-streamed chat completion for a catalog model through
// the gateway's upstream client — the same connection pools, timeouts and
// model mapping as client traffic — and returns the body and usage. body is
// a chat request whose "model" is the catalog id; it is rewritten to the
// upstream's name here. CallModel records no event: the plugin that calls
// it meters its whole call, so the tokens are billed once.
func (w *World) CallModel(ctx context.Context, model string, body []byte) ([]byte, catalog.Usage, error) {
	var usage catalog.Usage
	entry, ok := w.Catalog.Resolve(model)
	if !ok {
		return nil, usage, fmt.Errorf("%w: %q is not in the catalog", ErrModelUnavailable, model)
	}
	p := w.pools[entry.ID]
	if p == nil || len(p.members) == 0 {
		return nil, usage, fmt.Errorf("%w: %q has no upstream", ErrModelUnavailable, model)
	}
	rt := &w.Config.Routing
	up, _ := p.pick(rt, 0, 0)
	if up == nil {
		return nil, usage, fmt.Errorf("%w: %s", ErrModelUnavailable, p.allDown(model).Message)
	}
	up.health.inflight.Add(1)
	defer up.health.inflight.Add(-1)
	sent := time.Now()
	f, apiErr := scanRequest(body)
	if apiErr != nil {
		return nil, usage, fmt.Errorf("building model request: %s", apiErr.Message)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	out, _ := rewriteRequest(nil, body, &f, entry.UpstreamModelJSON, false)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(up.chatURL)
	req.Header.SetContentType("application/json")
	if up.authHeader != "" {
		req.Header.Set("Authorization", up.authHeader)
	}
	req.SetBodyRaw(out)
	// The upstream's first_byte_timeout and idle_timeout bound the call;
	// ctx is checked before it starts (fasthttp cannot cancel mid-call).
	if err := ctx.Err(); err != nil {
		return nil, usage, err
	}
	if err := up.client.Do(req, resp); err != nil {
		up.fail(rt, err.Error())
		return nil, usage, fmt.Errorf("%w: upstream %s: %v", ErrModelUnavailable, up.cfg.Name, err)
	}
	if resp.StatusCode() >= 500 {
		up.fail(rt, fmt.Sprintf("answered %d", resp.StatusCode()))
	} else {
		up.health.succeeded(time.Since(sent))
	}
	respBody := append([]byte(nil), resp.Body()...)
	if st := resp.StatusCode(); st < 200 || st > 299 {
		return nil, usage, &ModelError{Status: st, Body: respBody}
	}
	u := gjson.GetBytes(respBody, "usage")
	usage.PromptTokens = u.Get("prompt_tokens").Int()
	usage.CompletionTokens = u.Get("completion_tokens").Int()
	usage.CachedTokens = u.Get("prompt_tokens_details.cached_tokens").Int()
	usage.ReasoningTokens = u.Get("completion_tokens_details.reasoning_tokens").Int()
	return respBody, usage, nil
}

// Record hands a plugin's usage event to the meter; it never blocks.
func (s *Server) Record(ev *meter.Event) { s.recorder.Record(ev) }

// CheckBalance refuses a keyed call whose account is below the grace
// buffer (402); public calls pass.
func (s *Server) CheckBalance(w *World, call *Call) *APIError {
	if call.Key == nil {
		return nil
	}
	return s.checkBalance(w, call.Key)
}
