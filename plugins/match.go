package plugins

import (
	"context"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/tokens"
)

// matchBody is POST /v1/match (spec 4.10).
type matchBody struct {
	Source string `json:"source"`
	Query  string `json:"query"`
	Model  string `json:"model"`
}

const matchExample = `{"source": "Refunds are issued within 5 days.", "query": "how long do refunds take?"}`

func (b *matchBody) request(p config.Plugins) (classifiers.MatchRequest, *proxy.APIError) {
	req := classifiers.MatchRequest{Source: b.Source, Query: b.Query}
	if apiErr := requireText("source", b.Source, p); apiErr != nil {
		return req, apiErr
	}
	return req, requireText("query", b.Query, p)
}

func (m *module) handleMatch(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	var body matchBody
	if apiErr := decodeBody(ctx, &body, matchExample, call.World.Config.Plugins, 2, 0, ""); apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	req, apiErr := body.request(call.World.Config.Plugins)
	if apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	var res classifiers.ScoreResult
	m.execute(ctx, call, execution{
		endpoint: "/v1/match",
		price:    call.World.Config.Plugins.Pricing.Match,
		model:    body.Model,
		tokens:   int64(tokens.Count(req.Source) + tokens.Count(req.Query)),
		run: func(ctx context.Context, e classifiers.Engine) (classifiers.Answer, error) {
			var err error
			res, err = e.Match(ctx, req)
			return res.Answer, err
		},
		respond: func(t tail) any {
			return scoreResponse{Score: clamp01(res.Score), NoEvidence: res.NoEvidence, tail: t}
		},
	})
}
