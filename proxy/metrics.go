package proxy

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/meter"
)

// callMetrics counts generation calls for GET /metrics, by model, upstream,
// endpoint and status: calls, duration and time to first token as
// histograms, tokens by kind. Every label comes from the config in force
// or from a status code, and a reload drops the series of what it took
// away (forgetRetired), so the number of series stays bounded by the
// config: the models times the members of their pools, times the
// endpoints and statuses seen.
type callMetrics struct {
	mu     sync.RWMutex
	series map[seriesKey]*callSeries
}

type seriesKey struct {
	model, upstream, endpoint string
	status                    int
}

type callSeries struct {
	calls                                 atomic.Uint64
	interrupted                           atomic.Uint64 // streams cut after their first byte
	duration, ttft                        histogram
	prompt, cached, completion, reasoning atomic.Uint64
}

// latencyBounds are the histograms' upper bounds in seconds: from a cached
// answer on a local GPU to a long reasoning stream.
var latencyBounds = [...]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

type histogram struct {
	buckets [len(latencyBounds) + 1]atomic.Uint64 // the last is +Inf
	sumNs   atomic.Uint64
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(latencyBounds) && s > latencyBounds[i] {
		i++
	}
	h.buckets[i].Add(1)
	h.sumNs.Add(uint64(max(d, 0)))
}

func newCallMetrics() *callMetrics {
	return &callMetrics{series: map[seriesKey]*callSeries{}}
}

func (m *callMetrics) get(k seriesKey) *callSeries {
	m.mu.RLock()
	s := m.series[k]
	m.mu.RUnlock()
	if s != nil {
		return s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s = m.series[k]; s == nil {
		s = new(callSeries)
		m.series[k] = s
	}
	return s
}

// cmpSeriesKeys orders series as /metrics lists them.
func cmpSeriesKeys(a, b seriesKey) int {
	return cmp.Or(cmp.Compare(a.model, b.model), cmp.Compare(a.upstream, b.upstream),
		cmp.Compare(a.endpoint, b.endpoint), cmp.Compare(a.status, b.status))
}

// forgetRetired drops the series that name what w, put in force in place
// of old, no longer serves: a model it removed, an upstream it removed or
// took out of a model's pool. Kept, they grew /metrics with every rename
// for ever (a churn of upstream names, or a big config replaced by a
// small one, kept every series it ever had until a restart).
//
// A call still running on old may count after this and make its series
// again; every series naming an upstream is a (model, pool member) pair,
// so the next reload drops such a one, as it drops a generation call's
// series of a model w does not have. A plugin's call without an upstream
// may be labelled with an engine, not a catalog model: its series are
// dropped only by the reload that removes the model they name.
//
// The hot path takes the read lock for an existing series, and the write
// lock only to make one: the scan holds the read lock, as a scrape does,
// and the deletions take the write lock a batch at a time.
func (m *callMetrics) forgetRetired(old, w *World) {
	if old == nil {
		return
	}
	type servedBy struct{ model, upstream string }
	served := map[servedBy]bool{}
	for model, p := range w.pools {
		for _, member := range p.members {
			served[servedBy{model, member.up.cfg.Name}] = true
		}
	}
	stale := func(k seriesKey) bool {
		if k.upstream != "" {
			return !served[servedBy{k.model, k.upstream}]
		}
		if _, ok := w.pools[k.model]; ok {
			return false
		}
		_, wasModel := old.pools[k.model]
		return wasModel || k.endpoint == endpointChat.path() || k.endpoint == endpointResponses.path()
	}
	var doomed []seriesKey
	m.mu.RLock()
	for k := range m.series {
		if stale(k) {
			doomed = append(doomed, k)
		}
	}
	m.mu.RUnlock()
	const batch = 1024
	for len(doomed) > 0 {
		n := min(len(doomed), batch)
		m.mu.Lock()
		for _, k := range doomed[:n] {
			delete(m.series, k)
		}
		m.mu.Unlock()
		doomed = doomed[n:]
	}
}

// observeEvent counts a metered call from its usage event; interrupted
// says its stream was cut after the first byte (the client got a 200 and
// then an error event).
func (m *callMetrics) observeEvent(ev *meter.Event, interrupted bool) {
	s := m.get(seriesKey{ev.Model, ev.Upstream, ev.Endpoint, ev.Status})
	s.calls.Add(1)
	if interrupted {
		s.interrupted.Add(1)
	}
	s.duration.observe(ev.Latency)
	if ev.Status >= 200 && ev.Status < 300 && ev.TTFB > 0 { // plugin calls have none
		s.ttft.observe(ev.TTFB)
	}
	s.prompt.Add(uint64(max(ev.PromptTokens, 0)))
	s.cached.Add(uint64(max(ev.CachedTokens, 0)))
	s.completion.Add(uint64(max(ev.CompletionTokens, 0)))
	s.reasoning.Add(uint64(max(ev.ReasoningTokens, 0)))
}

// observe counts a call that ended without a usage event: an upstream's
// error passed through, or a 503 with no upstream to try ("" upstream).
func (m *callMetrics) observe(model, upstream, endpoint string, status int, took time.Duration) {
	s := m.get(seriesKey{model, upstream, endpoint, status})
	s.calls.Add(1)
	s.duration.observe(took)
}

// appendText appends the Prometheus text of every series to b.
func (m *callMetrics) appendText(b []byte) []byte {
	// The series are read from this copy, not through get: get would make
	// a series a reload dropped meanwhile again.
	type entry struct {
		k seriesKey
		s *callSeries
	}
	m.mu.RLock()
	all := make([]entry, 0, len(m.series))
	for k, s := range m.series {
		all = append(all, entry{k, s})
	}
	m.mu.RUnlock()
	slices.SortFunc(all, func(a, b entry) int { return cmpSeriesKeys(a.k, b.k) })
	labels := func(k seriesKey) string {
		return fmt.Sprintf("model=%s,upstream=%s,endpoint=%q,status=\"%d\"", promLabel(k.model), promLabel(k.upstream), k.endpoint, k.status)
	}
	b = append(b, "# HELP tollgate_requests_total Calls (generation, and classify, tag, score and match, public ones included, under their engine or llm model) by model, upstream, endpoint and status.\n# TYPE tollgate_requests_total counter\n"...)
	for _, e := range all {
		b = fmt.Appendf(b, "tollgate_requests_total{%s} %d\n", labels(e.k), e.s.calls.Load())
	}
	// Time to first token and tokens are measured on answered calls only:
	// an error status's series would stay 0 for ever.
	// A plugin call has no first token to wait for (its answer is the
	// engine's whole verdict): its series would stay 0 too.
	answered, generated := all[:0:0], all[:0:0]
	for _, e := range all {
		if e.k.status >= 200 && e.k.status < 300 {
			answered = append(answered, e)
			if e.k.endpoint == endpointChat.path() || e.k.endpoint == endpointResponses.path() {
				generated = append(generated, e)
			}
		}
	}
	b = append(b, "# HELP tollgate_requests_interrupted_total Answered streams the upstream cut or stalled after their first byte, or ended with its own error event for a fault of its own (the client got its status, then an error event); also in tollgate_requests_total.\n# TYPE tollgate_requests_interrupted_total counter\n"...)
	for _, e := range answered {
		b = fmt.Appendf(b, "tollgate_requests_interrupted_total{%s} %d\n", labels(e.k), e.s.interrupted.Load())
	}
	for _, h := range []struct {
		name, help string
		of         func(*callSeries) *histogram
		series     []entry
	}{
		{"tollgate_request_duration_seconds", "Calls in tollgate_requests_total from request to last byte.", func(s *callSeries) *histogram { return &s.duration }, all},
		{"tollgate_time_to_first_token_seconds", "Successful generation calls from request to the first byte of the answer (for a non-streamed answer, the whole body).", func(s *callSeries) *histogram { return &s.ttft }, generated},
	} {
		b = fmt.Appendf(b, "# HELP %s %s\n# TYPE %s histogram\n", h.name, h.help, h.name)
		for _, e := range h.series {
			hist := h.of(e.s)
			var count uint64
			l := labels(e.k)
			for i := range hist.buckets {
				count += hist.buckets[i].Load()
				le := "+Inf"
				if i < len(latencyBounds) {
					le = strconv.FormatFloat(latencyBounds[i], 'g', -1, 64)
				}
				b = fmt.Appendf(b, "%s_bucket{%s,le=%q} %d\n", h.name, l, le, count)
			}
			b = fmt.Appendf(b, "%s_sum{%s} %g\n%s_count{%s} %d\n", h.name, l, float64(hist.sumNs.Load())/1e9, h.name, l, count)
		}
	}
	b = append(b, "# HELP tollgate_tokens_total Tokens of answered calls (public plugin calls' too, though free), by kind (prompt includes cached; completion includes reasoning).\n# TYPE tollgate_tokens_total counter\n"...)
	for _, e := range answered {
		s, l := e.s, labels(e.k)
		for _, t := range []struct {
			kind string
			n    *atomic.Uint64
		}{{"prompt", &s.prompt}, {"cached", &s.cached}, {"completion", &s.completion}, {"reasoning", &s.reasoning}} {
			b = fmt.Appendf(b, "tollgate_tokens_total{%s,kind=%q} %d\n", l, t.kind, t.n.Load())
		}
	}
	return b
}

// refusals counts the requests the gateway itself answered with a 4xx: a
// key, balance, limit, body or route it refused, which no other series
// shows. It is per process, like the request log, so WriteError, which
// plugins and the admin API call without a Server, can count.
var refusals refusalCounts

// refusalEndpoints are the endpoint labels; any other path counts as
// "other", so a client cannot make up label values.
var refusalEndpoints = [...]string{"/v1/chat/completions", "/v1/responses", "/v1/classify", "/v1/tag",
	"/v1/score", "/v1/match", "/v1/batch", "/v1/models", "/admin", "/console", "other"}

// refusalStatuses are the statuses counted one by one; any other 4xx
// counts as "4xx".
var refusalStatuses = [...]int{400, 401, 402, 403, 404, 405, 408, 409, 413, 415, 429, 431}

type refusalCounts struct {
	n [len(refusalEndpoints)][len(refusalStatuses) + 1]atomic.Uint64
}

func (r *refusalCounts) count(path []byte, status int) {
	e := len(refusalEndpoints) - 1
	for i, ep := range refusalEndpoints[:e] {
		if pathUnder(path, ep) {
			e = i
			break
		}
	}
	s := len(refusalStatuses)
	for i, st := range refusalStatuses {
		if st == status {
			s = i
		}
	}
	r.n[e][s].Add(1)
}

// pathUnder says whether path is ep or a path below it (ep, then "/"):
// a plain prefix filed /v1/chat/completionsXYZ, /v1/tagging and /adminx,
// routes that do not exist, under /v1/chat/completions, /v1/tag and
// /admin.
func pathUnder(path []byte, ep string) bool {
	rest, ok := bytes.CutPrefix(path, []byte(ep))
	return ok && (len(rest) == 0 || rest[0] == '/')
}

// appendText appends the series that are not 0.
func (r *refusalCounts) appendText(b []byte) []byte {
	b = append(b, "# HELP tollgate_requests_refused_total Requests the gateway answered itself with a 4xx (key, balance, limits, body, route); not in tollgate_requests_total, but for a 429 because every upstream of a model rests.\n# TYPE tollgate_requests_refused_total counter\n"...)
	for e := range r.n {
		for s := range r.n[e] {
			n := r.n[e][s].Load()
			if n == 0 {
				continue
			}
			status := "4xx"
			if s < len(refusalStatuses) {
				status = strconv.Itoa(refusalStatuses[s])
			}
			b = fmt.Appendf(b, "tollgate_requests_refused_total{endpoint=%q,status=%q} %d\n", refusalEndpoints[e], status, n)
		}
	}
	return b
}

// promLabelEscapes writes a label value as Prometheus's text format reads
// it: only backslash, double quote and line feed are escaped there. Go's
// %q escaped a tab in an upstream's name as \t, which Prometheus refuses,
// and with it the whole scrape.
var promLabelEscapes = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// promLabel is v as a quoted label value.
func promLabel(v string) string {
	return `"` + promLabelEscapes.Replace(v) + `"`
}

// ObserveUnmetered counts a module's call that is not billed (a public
// classify or tag) in the request metrics, tokens and all, as Record
// counts a billed one; ev goes nowhere else.
func (s *Server) ObserveUnmetered(ev *meter.Event) {
	s.calls.observeEvent(ev, false)
}

// ObserveFailure counts a module's call that failed with status and no
// usage event (a 5xx of an engine whose upstream is down), as a generation
// call that got no answer is counted: WriteError counts only 4xx refusals.
func (s *Server) ObserveFailure(model, upstream, endpoint string, status int, took time.Duration) {
	s.calls.observe(model, upstream, endpoint, status, took)
}
