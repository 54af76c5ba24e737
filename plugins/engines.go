package plugins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// Engine names, as plugins.engine, the request's "model" and the
// response's "engine" spell them.
const (
	engineLLM     = classifiers.EngineLLM
	engineLexical = classifiers.EngineLexical
)

// lexicalEngine is shared: the lexical engine keeps no per-request state.
var lexicalEngine = sync.OnceValue(func() classifiers.Engine { return classifiers.NewLexical() })

// engineChoice is the engine one request runs on.
type engineChoice struct {
	engine   classifiers.Engine
	name     string  // engineLLM, engineSemantic or engineLexical
	model    string  // catalog id, llm only
	upstream string  // upstream name, llm only: the one that answered, else the pool's first
	probes   probes  // the health of the model's upstreams, llm only
	m        *module // whose engines an auto llm falls back to, llm only
	vectors  string  // plugins.vectors, for an auto llm's fallback and the advice of its errors
	// auto: chosen by plugins.engine auto, so an llm failure falls back
	// to the offline engine instead of failing the request.
	auto bool
	// standIn: an offline engine answering for auto's llm, whose upstream
	// is down. Labels only the llm tells apart tie there, flagged, where
	// an offline engine asked for refuses them (offlineAlone).
	standIn  bool
	fallback string
	// spent is what a failed llm attempt cost upstream (a wrong answer
	// asked twice), and spentModel and spentUpstream whose tokens they
	// were: billed with the call, answered or not, at least at that
	// model's prices whoever answered.
	spent                     classifiers.Usage
	spentModel, spentUpstream string
	// untaken: the llm failed with no upstream taken its request (each
	// refused the connection, was ejected or resting): the call's 503
	// spent nothing, and costs no quota.
	untaken bool
}

func lexicalChoice() *engineChoice {
	return &engineChoice{engine: lexicalEngine(), name: engineLexical}
}

// caller is whom an engine is chosen for: the configuration the call runs
// under, whose World also makes the llm engine's model calls, and the
// models its key may use. A request's caller is its key (callerOf); a
// batch job's is the key that created it, as the job recorded it.
type caller struct {
	world  *proxy.World
	models []string // empty: any model (a key without a list, or public mode)
	public bool     // no key (public mode)
}

// callerOf is the caller of a request.
func callerOf(call *proxy.Call) caller {
	c := caller{world: call.World, public: call.Key == nil}
	if call.Key != nil {
		c.models = call.Key.Models
	}
	return c
}

// allows reports whether the caller may use catalog model id.
func (c caller) allows(id string) bool { return accounts.ModelsAllow(c.models, id) }

// chooseEngine resolves the request's "model" (empty: plugins.engine).
func (m *module) chooseEngine(who caller, requested string) (*engineChoice, *proxy.APIError) {
	p := who.world.Config.Plugins
	switch requested {
	case engineLexical:
		return lexicalChoice(), nil
	case engineSemantic:
		e, err := m.vectors.engine(p.Vectors)
		if err != nil {
			return nil, onModel(proxy.NotAvailableHere("engine_unavailable", err.Error()+"; or send \"model\": \"lexical\""))
		}
		return &engineChoice{engine: e, name: engineSemantic}, nil
	case engineLLM:
		if p.LLMModel == "" {
			return nil, proxy.BadRequest("model", "the llm engine has no model: the catalog is empty; use model lexical")
		}
		return m.llmChoice(who, p.LLMModel, "model")
	case "":
	default:
		if _, ok := who.world.Catalog.Resolve(requested); !ok {
			msg := fmt.Sprintf("model %q does not exist; use semantic, lexical or llm", quotable(requested))
			// Only the models the key may use: a limited key was told of
			// models it then got a 403 for.
			if valid := who.world.ValidModels(who.models); !who.public && valid != "" {
				msg = fmt.Sprintf("model %q does not exist; use semantic, lexical, llm or a catalog model: %s", quotable(requested), valid)
			}
			return nil, proxy.BadRequest("model", msg)
		}
		if who.public {
			// Anyone could otherwise run the operator's dearest model for
			// free; plugins.llm_model ("llm", or auto) is the operator's choice.
			return nil, onModel(proxy.Forbidden(fmt.Sprintf("requests without an API key may not name a catalog model (%q); send an API key, or \"model\": %s or \"llm\"", requested, m.offlineEngines(p.Vectors))))
		}
		return m.llmChoice(who, requested, "model")
	}
	switch p.Engine {
	case engineLexical:
		return lexicalChoice(), nil
	case engineSemantic:
		// Configured, not asked for: without its vectors (warned about
		// at start) lexical answers and the response says so.
		return m.offlineChoice(p.Vectors), nil
	case engineLLM:
		return m.llmChoice(who, p.LLMModel, "plugins.llm_model")
	}
	// auto: llm while its upstream is up and the key may use its model.
	c := m.autoLLM(who)
	if c != nil && c.probes.up() {
		return c, nil
	}
	off := m.offlineChoice(p.Vectors)
	if c != nil {
		off.fallback, off.standIn = c.skippedNote(off), true
	}
	return off, nil
}

// offlineAlone reports whether an offline engine answers the call as the
// engine asked for ("model", or plugins.engine), not standing in for
// auto's llm: labels it cannot read are refused then (offlineLabels).
func (c *engineChoice) offlineAlone() bool { return offline(c.name) && !c.standIn }

// offlineLabels refuses, for a call an offline engine answers alone,
// labels (or tags, as field names them) it cannot read: one without a
// letter or digit, or two it reads as one ("C" and "C++"), between which
// every text would tie. The llm engine reads them as written, and the
// refusal says so. classifier names the saved classifier they are, ""
// when the request sent them.
func offlineLabels(field string, labels []string, classifier string) *proxy.APIError {
	ps := config.OfflineLabelProblems(field, labels, `send "model": "llm"`, 1)
	switch {
	case len(ps) == 0:
		return nil
	case classifier != "":
		return proxy.BadRequest("classifier", fmt.Sprintf("the saved classifier %q: %s", classifier, ps[0].Msg))
	}
	return proxy.BadRequest(ps[0].Field, ps[0].Msg)
}

// autoLLM is plugins.engine auto's llm choice for who, falling back to the
// offline engine when it fails; nil when auto can only answer offline (no
// llm_model, a key that may not use it, a model with no upstream). Whether
// the upstream is up is the caller's to ask: per request, or per line.
func (m *module) autoLLM(who caller) *engineChoice {
	p := who.world.Config.Plugins
	if p.LLMModel == "" || !who.allows(p.LLMModel) {
		return nil
	}
	c, apiErr := m.llmChoice(who, p.LLMModel, "plugins.llm_model")
	if apiErr != nil {
		return nil
	}
	c.auto = true
	return c
}

// onModel names "model" as the field of a refusal about the engine or
// model: the field a client changes to get past it, whether it sent one
// or plugins.engine chose.
func onModel(e *proxy.APIError) *proxy.APIError {
	e.Param = "model"
	return e
}

// offlineEngines words the offline engines a request can name instead of
// a model, for an error's advice: semantic only when its vectors load
// (a 503 told callers to send semantic on a gateway without them).
func (m *module) offlineEngines(vectors string) string {
	if _, err := m.vectors.engine(vectors); err != nil {
		return `"lexical"`
	}
	return `"semantic" or "lexical"`
}

// unavailable refuses, before the call is admitted, an llm chosen by name
// (or by plugins.engine llm) whose upstreams all failed their last probe
// or call: asking it would fail, and the failure used up the caller's
// quota, the public one request a minute too, so that the model the 503
// advised got a 429.
func (c *engineChoice) unavailable() *proxy.APIError {
	if c.name != engineLLM || c.auto || !c.probes.down() {
		return nil
	}
	if fault := c.probes.fault(); fault != nil {
		return engineError(c, fault)
	}
	return engineError(c, proxy.ErrModelUnavailable)
}

// offlineFallback is the offline engine an auto llm choice falls back to.
func (c *engineChoice) offlineFallback() *engineChoice { return c.m.offlineChoice(c.vectors) }

func (m *module) llmChoice(who caller, model, from string) (*engineChoice, *proxy.APIError) {
	entry, ok := who.world.Catalog.Resolve(model)
	if !ok {
		return nil, onModel(proxy.Unavailable(fmt.Sprintf("%s %q is not in the catalog", from, model)))
	}
	if !who.allows(entry.ID) {
		return nil, onModel(proxy.Forbidden(fmt.Sprintf("this API key may not use model %q (%s); send \"model\": %s (offline)", entry.ID, from, m.offlineEngines(who.world.Config.Plugins.Vectors))))
	}
	_, refused := m.logprobsRefused.Load(entry.ID)
	engine := classifiers.NewLLMWith(who.world, entry.ID, classifiers.LLMOptions{NoLogprobs: refused,
		LogprobsRefused: func() { m.logprobsRefused.Store(entry.ID, true) }})
	c := &engineChoice{engine: engine, name: engineLLM, model: entry.ID, upstream: entry.Upstream, m: m, vectors: who.world.Config.Plugins.Vectors}
	for _, member := range entry.Pool {
		for _, u := range who.world.Config.Upstreams {
			if u.Name == member.Name {
				c.probes = append(c.probes, m.probes.get(u))
			}
		}
	}
	if len(c.probes) == 0 {
		return nil, onModel(proxy.Unavailable(fmt.Sprintf("model %q has no configured upstream", entry.ID)))
	}
	return c, nil
}

// run runs the request, falling back to the offline engine when an
// auto-chosen llm fails: auto promises an answer, and the offline engines
// always have one.
func (c *engineChoice) run(ctx context.Context, do func(context.Context, classifiers.Engine) (classifiers.Answer, error)) (classifiers.Answer, *proxy.APIError) {
	var answeredBy proxy.UpstreamNote
	if c.name == engineLLM {
		ctx = proxy.WithUpstreamNote(ctx, &answeredBy)
	}
	ans, err := do(ctx, c.engine)
	if name := answeredBy.Name(); name != "" {
		// A pool's member that answered, not its first: the event's
		// upstream is the one whose tokens it bills.
		c.upstream = name
	}
	if err == nil {
		return ans, nil
	}
	if c.name == engineLLM {
		c.spent, c.spentModel, c.spentUpstream = ans.Usage, c.model, c.upstream
		if errors.Is(err, proxy.ErrModelUnavailable) {
			c.probes.markDown(err) // every member was tried
			c.untaken = !answeredBy.Reached() && c.spent.Tokens() == 0
		}
	}
	if ctx.Err() != nil {
		return ans, proxy.Unavailable("the request was cancelled: " + ctx.Err().Error())
	}
	if c.auto {
		off := c.offlineFallback()
		c.fallback = fallbackNote(c, err, off)
		c.engine, c.name, c.model, c.upstream = off.engine, off.name, "", ""
		ans, err = do(ctx, c.engine)
		if err == nil {
			// The answer's usage is what the call is billed: the upstream's
			// tokens too.
			ans.Usage = ans.Usage.Plus(c.spent)
			return ans, nil
		}
	}
	return ans, engineError(c, err)
}

// fallbackNote is the response's fallback: why the llm of c was wanted
// and off answered.
func fallbackNote(c *engineChoice, err error, off *engineChoice) string {
	return fmt.Sprintf("llm model %s failed (%s); %s answered", c.model, failure(c, err), off.name)
}

// failure words an llm failure for the client. Transport errors name
// internal addresses, so they are summarized, never quoted.
func failure(c *engineChoice, err error) string {
	var me *proxy.ModelError
	var fault *proxy.UpstreamFaultError
	switch {
	case errors.As(err, &fault):
		// Worded by the gateway, with nothing internal in it: the
		// operator's fix (base_url, api_key) is in it.
		return fault.Answer.Message
	case errors.Is(err, proxy.ErrModelUnavailable) && len(c.probes) > 1:
		return fmt.Sprintf("every upstream of model %s is unavailable", c.model)
	case errors.Is(err, proxy.ErrModelUnavailable):
		return fmt.Sprintf("upstream %s is unavailable", c.upstream)
	case errors.As(err, &me):
		return fmt.Sprintf("upstream %s answered %d", c.upstream, me.Status)
	}
	return err.Error()
}

// engineError is the answer to a request its engine failed. A model that
// answered, if not what was asked, spent tokens the call is billed for,
// and asking again would bill them again, at temperature 0 for the same
// answer: such an error carries x-should-retry: false, as the OpenAI SDKs
// otherwise retry every 5xx twice (one SDK call was three billed 502s).
// An upstream that is down spent nothing, and may be back on a retry.
func engineError(c *engineChoice, err error) *proxy.APIError {
	spent := c.spent.Tokens() > 0 || errors.Is(err, classifiers.ErrUnparseable)
	if offline(c.name) {
		apiErr := proxy.Internal("the " + c.name + " engine failed: " + err.Error())
		apiErr.NoRetry = spent
		return apiErr
	}
	var fault *proxy.UpstreamFaultError
	isFault := errors.As(err, &fault)
	advice := "retry later or send"
	if isFault {
		advice = "send" // not "retry later": the message says whose fix it waits for
	}
	if spent {
		advice = "the model's answers are billed, and asking again would bill them again; send"
	}
	msg := fmt.Sprintf("model %s: %s; %s \"model\": %s", c.model, failure(c, err), advice, c.m.offlineEngines(c.vectors))
	apiErr := &proxy.APIError{Status: fasthttp.StatusBadGateway, Type: "upstream_error", Code: "upstream_error", Message: msg}
	var answered *proxy.ModelError
	switch {
	case isFault:
		// As a chat call answers it: a 503 to retry later hid the
		// redirect, or the refused api_key, from everyone but the log.
		apiErr = &proxy.APIError{Status: fault.Answer.Status, Type: fault.Answer.Type, Code: fault.Answer.Code, Message: msg}
	case errors.Is(err, proxy.ErrModelUnavailable):
		apiErr = onModel(proxy.Unavailable(msg))
	case errors.As(err, &answered) && answered.Status == fasthttp.StatusTooManyRequests:
		// The upstream's 429 as a 429: a 502 made the SDKs ask again at
		// once, into the same limit.
		apiErr = &proxy.APIError{Status: fasthttp.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded", Message: msg}
	}
	// The wait the gateway knows (the upstream's Retry-After, or when an
	// ejected or resting pool is back), as a chat call is told it.
	apiErr.RetryAfter = proxy.RetryAfter(err)
	apiErr.NoRetry = spent
	return apiErr
}

// Health probes: auto uses llm while the upstream of llm_model answered
// GET <base_url>/models recently. Probes run on demand, at most one per
// upstream every probeEvery, in a goroutine of their own, so a request
// never holds a lock across one.
const (
	probeEvery   = 10 * time.Second
	probeStale   = 30 * time.Second       // older than this, a request waits for a fresh probe…
	probeWait    = 500 * time.Millisecond // …but no longer than this
	probeTimeout = 3 * time.Second
	// probeWhileDown: an upstream down, by a failed call or a failed
	// probe, is probed again this long after its last probe, not
	// probeEvery: one dropped connection sent every auto call and batch
	// line offline for 10 s while the upstream answered, and a probe
	// during a 0.4 s restart sent the rest of a job offline.
	probeWhileDown = time.Second
)

// probeSet is the probes of one plugins module: one gateway's view of its
// upstreams, kept across reloads.
type probeSet struct {
	client *fasthttp.Client // its connections are the probes' own

	mu         sync.Mutex
	byUpstream map[string]*probe
}

func newProbeSet() *probeSet {
	return &probeSet{byUpstream: map[string]*probe{}, client: &fasthttp.Client{
		Name:                "tollgate-probe",
		MaxConnsPerHost:     4,
		MaxIdleConnDuration: 4 * time.Second,
		ReadTimeout:         probeTimeout,
		WriteTimeout:        probeTimeout,
	}}
}

// get returns the probe of an upstream; upstreams are told apart by what
// a probe reaches, so a reload that changes base_url starts afresh.
func (s *probeSet) get(u config.Upstream) *probe {
	k := u.BaseURL + "\x00" + u.APIKey
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byUpstream[k]
	if p == nil {
		p = &probe{url: u.EndpointURL("/models", ""), apiKey: u.APIKey, client: s.client}
		s.byUpstream[k] = p
	}
	return p
}

type probe struct {
	url, apiKey string
	client      *fasthttp.Client

	mu        sync.Mutex
	checkedAt time.Time // when ok was last set, by a probe or a failed call
	ok        bool
	running   chan struct{} // closed when the probe in flight ends; nil when none
	// probedAt is when the last probe started, and nextProbe when the
	// next is due: probeEvery after it, or probeWhileDown after it once
	// it or a call failed.
	probedAt, nextProbe time.Time
	// failedCallAt is when a failed call marked the upstream down; zero
	// once a probe has answered since.
	failedCallAt time.Time
	// fault is the last failed call's redirect or refused api_key, kept
	// until a probe answers: its probes fail alike (GET /models is
	// redirected or refused too), and the calls refused meanwhile
	// (unavailable) say it, not "unavailable; retry later".
	fault *proxy.UpstreamFaultError
}

// startDue starts a probe when one is due and none is running.
//
// p.mu must be held.
func (p *probe) startDue() {
	if now := time.Now(); !now.Before(p.nextProbe) && p.running == nil {
		p.probedAt, p.nextProbe = now, now.Add(probeEvery)
		p.running = make(chan struct{})
		go p.check(p.running)
	}
}

// up reports whether the upstream answered its last probe (and failed no
// call since), starting a new probe when one is due.
func (p *probe) up() bool {
	p.mu.Lock()
	age := time.Since(p.checkedAt)
	p.startDue()
	running, ok := p.running, p.ok
	p.mu.Unlock()
	if age <= probeStale || running == nil {
		return ok
	}
	select {
	case <-running:
	case <-time.After(probeWait):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok && time.Since(p.checkedAt) <= probeStale
}

// down reports whether the upstream failed its last probe, or a call
// since, recently. Unlike !up, an upstream not probed yet, or whose probe
// is slow, is not down: a request that names the model is not refused on
// a guess, nor made to wait for a probe (an upstream whose GET /models is
// slow would hold every first call after a quiet spell). It starts a new
// probe as up does, but never waits for one.
func (p *probe) down() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	age := time.Since(p.checkedAt)
	p.startDue()
	return !p.checkedAt.IsZero() && !p.ok && age <= probeStale
}

func (p *probe) check(done chan struct{}) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(p.url)
	req.Header.SetMethod(fasthttp.MethodGet)
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	err := p.client.DoTimeout(req, resp, probeTimeout)
	// A 429 is an upstream up and at its limit: taken for down, a call
	// naming the llm got 503 upstream_unavailable without a wait where
	// chat passes the 429 and its Retry-After on, and auto's fallback
	// said the probe failed. Asked, the model answers its 429, which the
	// caller (or auto's fallback) is told as it is.
	status := resp.StatusCode()
	ok := err == nil && (status >= 200 && status <= 299 || status == fasthttp.StatusTooManyRequests)
	p.mu.Lock()
	p.ok, p.checkedAt, p.running, p.failedCallAt = ok, time.Now(), nil, time.Time{}
	if ok {
		p.fault = nil
	} else {
		p.nextProbe = p.probedAt.Add(probeWhileDown)
	}
	p.mu.Unlock()
	close(done)
}

// probes are the health of a model's upstreams, a pool's members each.
// Judged by the pool's first alone, a model whose first member was down
// was refused while the others answered its chat calls.
type probes []*probe

// up reports whether any of the upstreams is up (see probe.up).
func (ps probes) up() bool {
	for _, p := range ps {
		if p.up() {
			return true
		}
	}
	return false
}

// down reports whether every one of the upstreams is down (see probe.down).
func (ps probes) down() bool {
	for _, p := range ps {
		if !p.down() {
			return false
		}
	}
	return len(ps) > 0
}

// markDown records a model call that failed on every upstream the pool
// tried with err.
func (ps probes) markDown(err error) {
	var fault *proxy.UpstreamFaultError
	errors.As(err, &fault)
	for _, p := range ps {
		p.markDown(fault)
	}
}

// fault is the redirect or refused api_key that a call to the upstreams
// last failed with, while no probe has answered since; nil for none.
func (ps probes) fault() *proxy.UpstreamFaultError {
	for _, p := range ps {
		p.mu.Lock()
		fault := p.fault
		p.mu.Unlock()
		if fault != nil {
			return fault
		}
	}
	return nil
}

// markDown records a failed llm call: auto requests go offline until the
// next probe, due probeWhileDown after the last, finds the upstream
// back. One failure is not trusted for probeEvery: a connection dropped
// once says little of the next call.
func (p *probe) markDown(fault *proxy.UpstreamFaultError) {
	p.mu.Lock()
	now := time.Now()
	p.ok, p.checkedAt, p.failedCallAt, p.fault = false, now, now, fault
	if soon := p.probedAt.Add(probeWhileDown); soon.Before(p.nextProbe) {
		p.nextProbe = soon
	}
	p.mu.Unlock()
}

// downSince is when a failed call marked the upstream down (failedCall),
// else when its last probe failed (failedProbe); both zero when it
// answered its last probe, or has answered none yet.
func (p *probe) downSince() (failedCall, failedProbe time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.failedCallAt.IsZero():
		return p.failedCallAt, time.Time{}
	case !p.ok:
		return time.Time{}, p.checkedAt
	}
	return time.Time{}, time.Time{}
}

// skippedNote is the fallback of an auto answer that went offline without
// asking the model: why not. One with no word of why was taken for the
// llm's verdict being offline's, and every answer auto's llm did not
// give says so, whether a failed call, a failed probe or a probe not
// answered yet kept the model from it.
func (c *engineChoice) skippedNote(off *engineChoice) string {
	var lastCall, lastProbe time.Time
	for _, p := range c.probes {
		call, probe := p.downSince()
		if call.After(lastCall) {
			lastCall = call
		}
		if probe.After(lastProbe) {
			lastProbe = probe
		}
	}
	switch {
	case !lastCall.IsZero():
		return fmt.Sprintf("llm model %s not asked: a call to it failed at %s, and its upstream has not answered a probe since; %s answered",
			c.model, lastCall.UTC().Format(batch.TimeFormat), off.name)
	case !lastProbe.IsZero():
		return fmt.Sprintf("llm model %s not asked: its upstream failed its probe (GET /models) at %s; %s answered",
			c.model, lastProbe.UTC().Format(batch.TimeFormat), off.name)
	}
	return fmt.Sprintf("llm model %s not asked: its upstream's probe (GET /models) has not answered yet; %s answered", c.model, off.name)
}
