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

// Tag limits. The default of max_tags is the engines' (classifiers.TagRequest).
const (
	defaultMaxTags = 5
	maxMaxTags     = 50
)

// tagBody is POST /v1/tag: tags from a closed set when tags is given, open
// tags the engine finds otherwise.
type tagBody struct {
	Text      string       `json:"text"`
	Tags      []string     `json:"tags"`
	MaxTags   *wholeNumber `json:"max_tags"`
	Threshold *float64     `json:"threshold"`
	Model     string       `json:"model"`
}

const tagExample = `{"text": "The export button does nothing on Safari"}`

func (b *tagBody) request(p config.Plugins) (classifiers.TagRequest, *proxy.APIError) {
	req := classifiers.TagRequest{Text: b.Text, Tags: b.Tags, MaxTags: defaultMaxTags}
	if apiErr := requireText("text", b.Text, p); apiErr != nil {
		return req, apiErr
	}
	if b.Tags != nil && len(b.Tags) == 0 {
		// An empty closed set is a list built wrong, not a request for
		// open tags, which answered it with tags from outside any set.
		return req, proxy.BadRequest("tags", "tags is empty: give 1 to 200 tags, or leave tags out for open tags")
	}
	if b.Tags != nil { // nil: open tags
		if apiErr := firstProblem(config.CheckLabelList("tags", b.Tags, 1)); apiErr != nil {
			return req, apiErr
		}
	}
	// Held as classify's labels are: tags of megabytes took seconds of CPU
	// and a million tokens of a key's minute.
	total, apiErr := labelBytes("tags", b.Tags, p)
	if apiErr != nil {
		return req, apiErr
	}
	if total > config.MaxLabelSetBytes {
		return req, proxy.BadRequest("tags", fmt.Sprintf("tags take %d bytes; at most %d are accepted, as for the labels of /v1/classify", total, config.MaxLabelSetBytes))
	}
	if b.MaxTags != nil {
		if *b.MaxTags < 1 || *b.MaxTags > maxMaxTags {
			return req, proxy.BadRequest("max_tags", outOfRangeMsg("max_tags", *b.MaxTags))
		}
		req.MaxTags = int(*b.MaxTags)
	}
	if b.Threshold != nil {
		t, apiErr := checkThreshold(b.Threshold)
		req.Threshold = t
		return req, apiErr
	}
	if len(b.Tags) > 0 {
		req.Threshold = classifiers.DefaultTagThreshold
	}
	return req, nil // open tags: every tag the engine finds
}

// tagScore is one tag with its confidence.
type tagScore struct {
	Tag        string  `json:"tag"`
	Confidence float64 `json:"confidence"`
}

type tagResponse struct {
	Tags []tagScore `json:"tags"`
	tail
}

func (m *module) handleTag(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	var body tagBody
	if apiErr := decodeBody(ctx, &body, tagExample, call.World.Config.Plugins, 1, config.MaxLabelSetBytes, labelSetIs); apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	req, apiErr := body.request(call.World.Config.Plugins)
	if apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	var res classifiers.TagResult
	m.execute(ctx, call, execution{
		endpoint:    "/v1/tag",
		price:       call.World.Config.Plugins.Pricing.Tag,
		model:       body.Model,
		tokens:      int64(tokens.Count(req.Text)) + labelSetTokens(req.Tags, nil, nil),
		labels:      req.Tags,
		labelsField: "tags",
		run: func(ctx context.Context, e classifiers.Engine) (classifiers.Answer, error) {
			var err error
			res, err = e.Tag(ctx, req)
			return res.Answer, err
		},
		respond: func(t tail) any {
			out := tagResponse{Tags: make([]tagScore, 0, len(res.Tags)), tail: t}
			for _, s := range sortScores(res.Tags) {
				out.Tags = append(out.Tags, tagScore{Tag: s.Label, Confidence: s.Confidence})
			}
			return out
		},
	})
}
