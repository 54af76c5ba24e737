package plugins

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
)

// batchRoutes are /v1/batch and the paths under it (spec 4.3-4.9).
func (m *module) batchRoutes() []proxy.Route {
	var routes []proxy.Route
	for _, r := range []struct{ method, path string }{
		{fasthttp.MethodPost, "/v1/batch"},
		{fasthttp.MethodGet, "/v1/batch"},
		{fasthttp.MethodGet, "/v1/batch/*"},
		{fasthttp.MethodPost, "/v1/batch/*"},
		{fasthttp.MethodDelete, "/v1/batch/*"},
		// PUT and PATCH reach the handler only for its 405, whose Allow names
		// the methods of that path (a job, start or results) rather than
		// every method of any path under /v1/batch/.
		{fasthttp.MethodPut, "/v1/batch/*"},
		{fasthttp.MethodPatch, "/v1/batch/*"},
	} {
		routes = append(routes, proxy.Route{
			Method:  r.method,
			Path:    r.path,
			Auth:    proxy.AuthRequired,
			Scope:   accounts.ScopeBatch,
			Limits:  proxy.LimitNone, // jobs are limited to one at a time per account
			Handler: m.handleBatch,
		})
	}
	// The OpenAI Files and Batch APIs (the SDKs' client.files and
	// client.batches) are not served; their clients got a bare "no route
	// for POST /v1/batches" and no word of /v1/batch. Answered without a
	// key, as that 404 was.
	for _, path := range []string{"/v1/batches", "/v1/batches/*", "/v1/files", "/v1/files/*"} {
		routes = append(routes, proxy.Route{Method: proxy.AnyMethod, Path: path, Auth: proxy.AuthNone, Limits: proxy.LimitNone, Handler: openAIBatchNotServed})
	}
	return routes
}

// openAIBatchNotServed answers the OpenAI Files and Batch API paths.
func openAIBatchNotServed(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	proxy.WriteError(ctx, proxy.NotFound("no route for "+string(ctx.Method())+" "+string(ctx.Path())+
		": Tollgate does not serve the OpenAI Files and Batch APIs; its batch API is /v1/batch, which classifies a file of texts"+
		" (POST /v1/batch with the labels, upload the file to its upload_url, then POST /v1/batch/{job_id}/start: see \"Batch jobs\" in the README)"))
}

// engineAuto is plugins.engine's per-request choice between llm and the offline engine.
const engineAuto = "auto"

// Batch sets up batch jobs in the plugins module (Options.Batch).
type Batch struct {
	// Open opens this process's batch service on rt, the runtime the
	// module provides: the configuration in force and the engine choice
	// of /v1/classify, made for the key that created each job. The module
	// calls it once, when the server starts, with the server's context;
	// the caller runs the service's worker if it wants one.
	Open func(ctx context.Context, rt batch.Runtime) (*batch.Service, error)
}

// batchBody is POST /v1/batch: the classify fields without text (spec
// 4.3), and model as in classify.
type batchBody struct {
	Labels       []string            `json:"labels"`
	Classifier   string              `json:"classifier"`
	Descriptions map[string]string   `json:"descriptions"`
	Examples     map[string][]string `json:"examples"`
	TextType     string              `json:"text_type"`
	Mode         string              `json:"mode"`
	Threshold    *float64            `json:"threshold"`
	Model        string              `json:"model"`
}

const batchExample = `{"labels": ["billing", "bug", "other"]}`

// batchCallTimeout bounds one API call's NATS and storage work.
const batchCallTimeout = 30 * time.Second

func (m *module) handleBatch(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	svc := m.jobs
	if svc == nil {
		proxy.WriteError(ctx, proxy.NotAvailableHere("batch_unavailable", "batch jobs are not set up on this gateway (they need object storage: see storage in gateway.yaml)"))
		return
	}
	c, cancel := context.WithTimeout(context.Background(), batchCallTimeout)
	defer cancel()
	method := string(ctx.Method())
	rest := strings.TrimPrefix(string(ctx.Path()), "/v1/batch")
	if rest == "" {
		if method == fasthttp.MethodPost {
			m.createBatch(c, ctx, call, svc)
		} else {
			listBatch(c, ctx, call, svc)
		}
		return
	}
	id, action, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	if id == "" {
		proxy.WriteError(ctx, proxy.NotFound("no route for "+method+" "+string(ctx.Path())+": name a job, /v1/batch/{job_id}"))
		return
	}
	switch {
	case action == "" && method == fasthttp.MethodGet:
		j, err := svc.Get(c, call.Key.Account, id)
		if err != nil {
			writeBatchError(ctx, call, err)
			return
		}
		writeJSON(ctx, j.View())
	case action == "" && method == fasthttp.MethodDelete:
		if err := svc.Delete(c, call.Key.Account, id); err != nil {
			writeBatchError(ctx, call, err)
			return
		}
		writeJSON(ctx, struct {
			JobID   string `json:"job_id"`
			Deleted bool   `json:"deleted"`
		}{id, true})
	case action == "start" && method == fasthttp.MethodPost:
		startBatch(c, ctx, call, svc, id)
	case action == "results" && method == fasthttp.MethodGet:
		url, expires, err := svc.Results(c, call.Key.Account, id)
		if err != nil {
			writeBatchError(ctx, call, err)
			return
		}
		writeJSON(ctx, struct {
			JobID       string `json:"job_id"`
			DownloadURL string `json:"download_url"`
			ExpiresAt   string `json:"expires_at"`
		}{id, url, expires.UTC().Format(batch.TimeFormat)}) // with milliseconds, as the job's times (it had whole seconds)
	case action == "":
		batchMethodNotAllowed(ctx, "DELETE, GET, HEAD")
	case action == "start":
		batchMethodNotAllowed(ctx, "POST")
	case action == "results":
		batchMethodNotAllowed(ctx, "GET, HEAD")
	default:
		proxy.WriteError(ctx, proxy.NotFound("no route for "+method+" "+string(ctx.Path())+
			": batch paths are /v1/batch/{job_id}, /v1/batch/{job_id}/start and /v1/batch/{job_id}/results"))
	}
}

func batchMethodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	proxy.WriteError(ctx, &proxy.APIError{Status: fasthttp.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: string(ctx.Method()) + " is not allowed here; use " + allow})
}

func (m *module) createBatch(c context.Context, ctx *fasthttp.RequestCtx, call *proxy.Call, svc *batch.Service) {
	var body batchBody
	if apiErr := decodeBody(ctx, &body, batchExample, call.World.Config.Plugins, classifyTexts-1, classifyLabelSets, labelSetIs); apiErr != nil { // no text
		proxy.WriteError(ctx, apiErr)
		return
	}
	cb := classifyBody{Labels: body.Labels, Classifier: body.Classifier, Descriptions: body.Descriptions,
		Examples: body.Examples, TextType: body.TextType, Mode: body.Mode, Threshold: body.Threshold}
	req, apiErr := cb.classification(call.World.Config)
	switch {
	case apiErr != nil:
	case body.Model != "" || call.World.Config.Plugins.Engine != engineAuto:
		// The engine is chosen again when the job runs; this refuses now
		// a model that does not exist or that the key may not use, and
		// labels an offline engine asked for cannot read. (auto refuses
		// nothing, and would only wait for a health probe.)
		var choice *engineChoice
		if choice, apiErr = m.chooseEngine(callerOf(call), body.Model); apiErr == nil && choice.offlineAlone() {
			apiErr = offlineLabels("labels", req.Labels, body.Classifier)
		}
	case m.autoLLM(callerOf(call)) == nil:
		// auto with no llm this key may use: offline answers every line.
		apiErr = offlineLabels("labels", req.Labels, body.Classifier)
	}
	if apiErr == nil {
		apiErr = call.Server.CheckBalance(call.World, call)
	}
	if apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	created, err := svc.Create(c, batch.CreateParams{
		Account: call.Key.Account, KeyID: call.Key.ID, KeyModels: call.Key.Models, Classifier: body.Classifier, Model: body.Model,
		Request: batch.Request{Labels: req.Labels, Descriptions: req.Descriptions, Examples: req.Examples,
			TextType: req.TextType, Mode: req.Mode, Threshold: req.Threshold},
	})
	if err != nil {
		writeBatchError(ctx, call, err)
		return
	}
	writeJSON(ctx, created)
	ctx.SetStatusCode(fasthttp.StatusCreated)
}

func startBatch(c context.Context, ctx *fasthttp.RequestCtx, call *proxy.Call, svc *batch.Service, id string) {
	if len(ctx.PostBody()) > 0 && strings.TrimSpace(string(ctx.PostBody())) != "{}" {
		proxy.WriteError(ctx, proxy.BadRequest("", "POST /v1/batch/{job_id}/start takes no body"))
		return
	}
	if apiErr := call.Server.CheckBalance(call.World, call); apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	j, err := svc.Start(c, call.Key.Account, id)
	if err != nil {
		writeBatchError(ctx, call, err)
		return
	}
	writeJSON(ctx, struct {
		JobID  string       `json:"job_id"`
		Status batch.Status `json:"status"`
	}{j.ID, j.Status})
	ctx.SetStatusCode(fasthttp.StatusAccepted)
}

func listBatch(c context.Context, ctx *fasthttp.RequestCtx, call *proxy.Call, svc *batch.Service) {
	// limit, after and order (OpenAI's list parameters) were taken and
	// ignored: a caller asking for 50, or the page after a job, got the
	// same 20 newest and no word of it.
	if q := ctx.URI().QueryString(); len(q) > 0 {
		// The first parameter, as the query decodes it ("li%6Dit" is
		// limit); a query of separators alone ("?&") names none.
		var name string
		ctx.QueryArgs().VisitAll(func(k, _ []byte) {
			if name == "" && len(k) > 0 {
				name = string(k)
			}
		})
		what := "this one has " + strconv.Quote(name)
		if name == "" {
			what = "this one has " + strconv.Quote("?"+string(q))
		}
		proxy.WriteError(ctx, proxy.BadRequest(name, "GET /v1/batch takes no query parameters ("+what+"): it lists your 20 newest jobs, newest first; GET /v1/batch/{job_id} reads any job"))
		return
	}
	jobs, err := svc.List(c, call.Key.Account)
	if err != nil {
		writeBatchError(ctx, call, err)
		return
	}
	items := make([]batch.ListItem, len(jobs))
	for i, j := range jobs {
		items[i] = j.ListItem()
	}
	writeJSON(ctx, items)
}

func writeBatchError(ctx *fasthttp.RequestCtx, call *proxy.Call, err error) {
	var be *batch.Error
	if errors.As(err, &be) {
		switch {
		case errors.Is(err, batch.ErrNotFound):
			proxy.WriteError(ctx, proxy.NotFound(be.Msg))
			return
		case errors.Is(err, batch.ErrConflict):
			// The OpenAI SDKs retry every 409 twice, over about 2 s, and a
			// job completed, being deleted or processing answers the same:
			// three calls for one answer. Results not ready are no
			// exception: a job takes longer than the retries, and its
			// client polls GET /v1/batch/{job_id} for the end.
			apiErr := proxy.Conflict(be.Msg)
			apiErr.NoRetry = !be.Passing
			proxy.WriteError(ctx, apiErr)
			return
		case errors.Is(err, batch.ErrTooManyPending):
			proxy.WriteError(ctx, proxy.LimitReached("too_many_batch_jobs", be.Msg))
			return
		case errors.Is(err, batch.ErrCreatedTooFast):
			proxy.WriteError(ctx, proxy.CreatedTooFast(be.Msg, be.RetryAfter))
			return
		case errors.Is(err, batch.ErrNoInput), errors.Is(err, batch.ErrInvalid):
			proxy.WriteError(ctx, proxy.BadRequest("", be.Msg))
			return
		}
	}
	// The object store or the job records could not be reached: the
	// cause names the store's address (a private S3 endpoint), which is
	// the operator's, in the log under the request id.
	call.Server.Logf("batch: request %s: %v", call.RequestID, err)
	// Retry-After: an outage of the store or an election ends by itself,
	// and the SDKs then wait a second between their retries, not the
	// half second they wait without it.
	proxy.WriteError(ctx, &proxy.APIError{Status: fasthttp.StatusServiceUnavailable, Type: "service_unavailable_error", Code: "batch_unavailable", RetryAfter: time.Second,
		Message: "batch jobs cannot be reached now (their object store or job records did not answer); try again (request " + call.RequestID + ")"})
}

// batchRuntime serves batch.Runtime from the configuration in force of
// the module's server.
type batchRuntime struct {
	host proxy.Host
	m    *module
}

func (r batchRuntime) Config() *config.Config { return r.host.World().Config }

func (r batchRuntime) CanPay(account string, cost money.Nanos) (money.Nanos, bool) {
	return r.host.CanPay(account, cost)
}

func (r batchRuntime) Debited(account string) (money.Nanos, bool) { return r.host.Debited(account) }

func (r batchRuntime) NoteCharge(account string, cost money.Nanos) { r.host.NoteCharge(account, cost) }

// Engine picks a job's engine as classify picks a request's, for the key
// that created the job, with the model calls made by the World in force.
// With plugins.engine auto the choice is made per line, so a long job
// follows its upstream going down and coming back.
func (r batchRuntime) Engine(job *batch.Job) (batch.Engine, error) {
	who := caller{world: r.host.World(), models: job.KeyModels}
	p := who.world.Config.Plugins
	if job.Model == "" && p.Engine == engineAuto {
		if c := r.m.autoLLM(who); c != nil {
			return &batchEngine{choice: c, world: who.world}, nil
		}
		return &batchEngine{choice: r.m.offlineChoice(p.Vectors), world: who.world}, nil
	}
	c, apiErr := r.m.chooseEngine(who, job.Model)
	if apiErr != nil {
		return nil, errors.New(apiErr.Message)
	}
	return &batchEngine{choice: c, world: who.world}, nil
}

// batchEngine runs a job's lines on one engine choice; unlike
// engineChoice.run it never changes the choice, so it is safe for the
// job's concurrent lines. Each line is described and billed as
// /v1/classify describes and bills the same call alone.
type batchEngine struct {
	choice *engineChoice
	world  *proxy.World // whose catalog prices the model's tokens
}

func (e *batchEngine) Classify(ctx context.Context, req classifiers.ClassifyRequest) (batch.Answer, error) {
	c := e.choice
	if c.auto && !c.probes.up() {
		off := c.offlineFallback()
		res, err := off.engine.Classify(ctx, req)
		return batch.Answer{ClassifyResult: res, Fallback: c.skippedNote(off)}, err
	}
	if offline(c.name) {
		res, err := c.engine.Classify(ctx, req)
		return batch.Answer{ClassifyResult: res}, err
	}
	var answeredBy proxy.UpstreamNote
	res, err := c.engine.Classify(proxy.WithUpstreamNote(ctx, &answeredBy), req)
	// This line's view of the choice: the pool member that took its call,
	// not the pool's first, is the upstream its event and errors name.
	line := *c
	line.upstream = cmp.Or(answeredBy.Name(), c.upstream)
	spent := batch.ModelPart{Model: c.model, Upstream: line.upstream, Usage: res.Usage, Cost: modelCost(e.world, c.model, res.Usage)}
	if err == nil || ctx.Err() != nil {
		return batch.Answer{ClassifyResult: res, Spent: spent}, err
	}
	if errors.Is(err, proxy.ErrModelUnavailable) {
		c.probes.markDown(err)
	}
	if c.auto {
		off := c.offlineFallback()
		ans, offErr := off.engine.Classify(ctx, req)
		// The line is billed the upstream's tokens too.
		ans.Usage = ans.Usage.Plus(res.Usage)
		return batch.Answer{ClassifyResult: ans, Fallback: fallbackNote(&line, err, off), Spent: spent}, offErr
	}
	msg := fmt.Sprintf("model %s: %s", c.model, failure(&line, err))
	var me *proxy.ModelError
	if errors.Is(err, proxy.ErrModelUnavailable) || errors.As(err, &me) && (me.Status >= 500 || me.Status == fasthttp.StatusTooManyRequests) {
		return batch.Answer{ClassifyResult: res, Spent: spent}, &batch.UnavailableError{Msg: msg, RetryAfter: proxy.RetryAfter(err)}
	}
	return batch.Answer{ClassifyResult: res, Spent: spent}, errors.New(msg)
}
