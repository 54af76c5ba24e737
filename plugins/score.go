package plugins

import (
	"context"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/tokens"
)

// maxAttributeBytes bounds an attribute name; a description is the place
// for more words.
const maxAttributeBytes = 200

// scoreBody is POST /v1/score (spec 4.2).
type scoreBody struct {
	Source      string `json:"source"`
	Attribute   string `json:"attribute"`
	Description string `json:"description"`
	Model       string `json:"model"`
}

const scoreExample = `{"source": "Server is down, customers cannot pay!", "attribute": "urgency"}`

func (b *scoreBody) request(p config.Plugins) (classifiers.ScoreRequest, *proxy.APIError) {
	req := classifiers.ScoreRequest{Source: b.Source, Attribute: b.Attribute, Description: b.Description}
	if apiErr := requireText("source", b.Source, p); apiErr != nil {
		return req, apiErr
	}
	if b.Attribute == "" {
		return req, proxy.BadRequest("attribute", "attribute is required: a name such as urgency, toxicity, sentiment, formality, quality or spam")
	}
	if config.Blank(b.Attribute) {
		// Scored 0, and billed, as if the text had none of it.
		return req, proxy.BadRequest("attribute", "attribute holds only whitespace or invisible characters: name one such as urgency, toxicity, sentiment, formality, quality or spam")
	}
	if len(b.Attribute) > maxAttributeBytes {
		return req, proxy.BadRequest("attribute", fmt.Sprintf("attribute is %d bytes, longer than %d; put the details in description", len(b.Attribute), maxAttributeBytes))
	}
	if b.Description != "" && config.Blank(b.Description) {
		// Optional, but one sent must say something: it was scored as
		// if absent, and billed, as a blank text is refused.
		return req, proxy.BadRequest("description", "description holds only whitespace or invisible characters: leave it out, or say in plain words what the attribute means")
	}
	return req, maxText("description", b.Description, p)
}

// scoreResponse is spec 2.4 (score, latency_ms, usage) plus who answered.
type scoreResponse struct {
	Score      float64 `json:"score"`
	NoEvidence bool    `json:"no_evidence,omitempty"`
	tail
}

func (m *module) handleScore(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	var body scoreBody
	if apiErr := decodeBody(ctx, &body, scoreExample, call.World.Config.Plugins, 2, maxAttributeBytes, fmt.Sprintf("the attribute %d bytes", maxAttributeBytes)); apiErr != nil {
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
		endpoint: "/v1/score",
		price:    call.World.Config.Plugins.Pricing.Score,
		model:    body.Model,
		tokens:   int64(tokens.Count(req.Source) + tokens.Count(req.Attribute) + tokens.Count(req.Description)),
		run: func(ctx context.Context, e classifiers.Engine) (classifiers.Answer, error) {
			var err error
			res, err = e.Score(ctx, req)
			return res.Answer, err
		},
		respond: func(t tail) any {
			return scoreResponse{Score: clamp01(res.Score), NoEvidence: res.NoEvidence, tail: t}
		},
	})
}

// clamp01 holds the spec's promise that scores are in [0,1] whatever an
// engine returns.
func clamp01(v float64) float64 {
	if !(v > 0) { // also NaN
		return 0
	}
	return min(v, 1)
}
