// Package plugins holds the gateway's internal endpoints (classify, tag,
// score, match, batch) as one proxy.Module: cmd/tollgate lists
// Module(Options{...}) among the modules of its server, and proxy never
// names a plugin.
//
// What the endpoints keep between requests belongs to the module value,
// one per server and kept across reloads: the health probes of the llm
// engine's upstreams, the semantic engine's word vectors, and the batch
// service, opened in the module's Start with the runtime the module
// provides (Batch.Open). Each provisioning builds the routes anew over
// that state.
package plugins

import (
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// Options configures the plugins module.
type Options struct {
	// Batch serves /v1/batch; nil answers it with 503 (batch jobs need
	// object storage).
	Batch *Batch
	// PreloadVectors loads the semantic engine's word vectors at start and
	// at each reload, so that a missing file is said then, not found by
	// the first request that needs it.
	PreloadVectors bool
}

// module is the state of one server's plugins.
type module struct {
	opts    Options
	probes  *probeSet
	vectors *vectorSet
	jobs    *batch.Service // set by start, before any route serves; nil without Options.Batch
	// logprobsRefused holds the catalog ids whose model refused logprobs
	// (a reasoning model answers 400): their llm engine asks without them,
	// instead of a refused call before every request. A reload forgets
	// them, as an id may then name another model.
	logprobsRefused sync.Map // catalog id → true
}

// Module returns the plugins module of one server; another server needs
// a Module of its own.
func Module(opts Options) proxy.Module {
	m := &module{opts: opts, probes: newProbeSet(), vectors: newVectorSet()}
	return proxy.Module{ID: "plugins", Start: m.start, New: m.provision}
}

func (m *module) start(h proxy.Host) (func(), error) {
	m.vectors.mu.Lock()
	m.vectors.logf = h.Logf
	m.vectors.mu.Unlock()
	if m.opts.Batch == nil {
		return nil, nil
	}
	jobs, err := m.opts.Batch.Open(h.Context(), batchRuntime{host: h, m: m})
	if err != nil {
		return nil, err
	}
	m.jobs = jobs
	return nil, nil
}

// provision runs at start and at each config reload: a reload is when an
// admin who fixed the vectors file expects it to be used, so files that
// failed are tried again (at once with PreloadVectors, else on first use).
func (m *module) provision(_ proxy.Host, w *proxy.World) (proxy.Provisioned, error) {
	m.vectors.forgetFailures()
	m.logprobsRefused.Clear()
	if m.opts.PreloadVectors {
		_, _ = m.vectors.engine(w.Config.Plugins.Vectors) // logs what it found
	}
	return proxy.Provisioned{Routes: append(m.classifierRoutes(w.Config), m.batchRoutes()...)}, nil
}

// classifierRoutes are POST /v1/classify, /v1/tag, /v1/score and
// /v1/match: each needs the classify scope and counts against its
// caller's limits; only classify and tag have a public mode (spec 5.2),
// off while plugins.public_limits.requests_per_minute is 0.
func (m *module) classifierRoutes(cfg *config.Config) []proxy.Route {
	// MaxBody: a Content-Length over what the endpoint's fields can hold
	// is its 413 from the headers (under Expect: 100-continue too), before
	// any of it is held; read first, a public classify or tag without a
	// key held up to max_request_body per connection.
	p := cfg.Plugins
	post := func(path string, auth proxy.AuthMode, h func(*fasthttp.RequestCtx, *proxy.Call), maxBody int64) proxy.Route {
		return proxy.Route{Method: fasthttp.MethodPost, Path: path, Auth: auth, Scope: accounts.ScopeClassify,
			Limits: proxy.LimitCaller, Handler: h, MaxBody: maxBody}
	}
	public := proxy.AuthOptional
	if cfg.Plugins.PublicLimits.RequestsPerMinute == 0 {
		public = proxy.AuthRequired
	}
	return []proxy.Route{
		post("/v1/classify", public, m.handleClassify, maxBody(p, classifyTexts, classifyLabelSets)),
		post("/v1/tag", public, m.handleTag, maxBody(p, 1, config.MaxLabelSetBytes)),
		post("/v1/score", proxy.AuthRequired, m.handleScore, maxBody(p, 2, maxAttributeBytes)),
		post("/v1/match", proxy.AuthRequired, m.handleMatch, maxBody(p, 2, 0)),
	}
}
