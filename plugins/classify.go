package plugins

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/suggest"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/tokens"
)

// classifyBody is POST /v1/classify: text plus the fields of batch job
// creation (spec 4.3), and model.
type classifyBody struct {
	Text         string              `json:"text"`
	Labels       []string            `json:"labels"`
	Classifier   string              `json:"classifier"`
	Descriptions map[string]string   `json:"descriptions"`
	Examples     map[string][]string `json:"examples"`
	TextType     string              `json:"text_type"`
	Mode         string              `json:"mode"`
	Threshold    *float64            `json:"threshold"`
	Model        string              `json:"model"`
}

const classifyExample = `{"text": "I was charged twice", "labels": ["billing", "bug"]}`

// A classify body holds two texts (text and text_type) and a label set,
// whose labels may each be written three times (in labels, and as keys
// of descriptions and examples): see maxBody.
const (
	classifyTexts     = 2
	classifyLabelSets = 3 * config.MaxLabelSetBytes
)

// labelSetIs is what a label set may hold, as a 413 says it.
var labelSetIs = fmt.Sprintf("a label set %d KiB", config.MaxLabelSetBytes>>10)

// request validates the body, filling in a saved classifier it names.
func (b *classifyBody) request(cfg *config.Config) (classifiers.ClassifyRequest, *proxy.APIError) {
	if err := requireText("text", b.Text, cfg.Plugins); err != nil {
		return classifiers.ClassifyRequest{}, err
	}
	req, apiErr := b.classification(cfg)
	req.Text = b.Text
	return req, apiErr
}

// classification validates every field but text, which batch jobs share
// (spec 4.3).
func (b *classifyBody) classification(cfg *config.Config) (classifiers.ClassifyRequest, *proxy.APIError) {
	req := classifiers.ClassifyRequest{
		Labels: b.Labels, Descriptions: b.Descriptions, Examples: b.Examples,
		TextType: b.TextType, Mode: classifiers.Mode(b.Mode),
	}
	threshold := b.Threshold
	if b.Classifier != "" {
		saved, ok := cfg.Classifiers[b.Classifier]
		if !ok {
			return req, proxy.BadRequest("classifier", fmt.Sprintf("classifier %q is not defined%s; %s", quotable(b.Classifier), nearestClassifier(cfg, b.Classifier), savedList(cfg)))
		}
		for _, f := range []struct {
			name string
			set  bool
		}{{"labels", b.Labels != nil}, {"descriptions", b.Descriptions != nil}, {"examples", b.Examples != nil}} {
			if f.set {
				return req, proxy.BadRequest(f.name, fmt.Sprintf("%s cannot be sent with classifier: the saved classifier %q is the whole label set, with its labels, descriptions and examples (gateway.yaml, classifiers); send labels instead of classifier to give your own", f.name, b.Classifier))
			}
		}
		req.Labels, req.Descriptions, req.Examples = saved.Labels, saved.Descriptions, saved.Examples
		if req.TextType == "" {
			req.TextType = saved.TextType
		}
		if req.Mode == "" {
			req.Mode = classifiers.Mode(saved.Mode)
		}
		if threshold == nil {
			threshold = &saved.Threshold
		}
	} else if b.Labels == nil {
		return req, proxy.BadRequest("labels", fmt.Sprintf("labels is required (1 to %d labels), unless classifier names a saved classifier", config.MaxLabels))
	}
	if req.Mode == "" {
		req.Mode = classifiers.ModeSingle
	}
	t, apiErr := checkThreshold(threshold)
	if apiErr != nil {
		return req, apiErr
	}
	req.Threshold = t
	if apiErr := firstProblem(config.FirstClassificationProblem(config.Classifier{
		Labels: req.Labels, Descriptions: req.Descriptions, Examples: req.Examples,
		TextType: req.TextType, Mode: string(req.Mode), Threshold: t,
	}, cfg.Plugins.MaxTextBytes)); apiErr != nil {
		return req, apiErr
	}
	// A key may name its label in the other Unicode form ("cafe\u0301"
	// for "café"); the engines look descriptions and examples up by the
	// label as written.
	req.Descriptions, req.Examples = config.ByLabel(req.Labels, req.Descriptions), config.ByLabel(req.Labels, req.Examples)
	return req, oneLabelSingle(req, b.Classifier)
}

// oneLabelSingle refuses single mode over one label: every engine
// answered that label at confidence 1, with no tie and nothing to say the
// text had no evidence for it ("Let us meet for lunch tomorrow" was spam
// at 1). Multi mode answers the question such a request asks: whether the
// label applies. classifier names the saved classifier the labels came
// from, "" when the request sent them.
func oneLabelSingle(req classifiers.ClassifyRequest, classifier string) *proxy.APIError {
	if req.Mode != classifiers.ModeSingle || len(req.Labels) != 1 {
		return nil
	}
	advice := fmt.Sprintf(`send "mode": "multi", whose confidence says whether %q applies, or labels to choose between`, quotable(req.Labels[0]))
	if classifier != "" {
		return proxy.BadRequest("mode", fmt.Sprintf("the saved classifier %q has one label, and single mode always answers it, at confidence 1: %s", classifier, advice))
	}
	return proxy.BadRequest("labels", "single mode with one label always answers it, at confidence 1: "+advice)
}

// nearestClassifier is " (did you mean …?)" for a name a typo away from a
// saved classifier's, or "".
func nearestClassifier(cfg *config.Config, name string) string {
	names := cfg.ClassifierNames()
	norm := make([]string, len(names)) // suggest.Nearest reads '-' as '_'
	for i, n := range names {
		norm[i] = strings.ToLower(strings.ReplaceAll(n, "-", "_"))
	}
	if near := suggest.Nearest(name, norm); near != "" {
		return fmt.Sprintf(" (did you mean %q?)", names[slices.Index(norm, near)])
	}
	return ""
}

func savedList(cfg *config.Config) string {
	names := cfg.ClassifierNames()
	if len(names) == 0 {
		return "no saved classifiers are defined (gateway.yaml, classifiers)"
	}
	return "saved classifiers: " + strings.Join(names, ", ")
}

// classifySingle is the answer in mode single: the best label, and every
// label by confidence.
type classifySingle struct {
	Mode       string  `json:"mode"`
	Classifier string  `json:"classifier,omitempty"`
	Label      string  `json:"label"`
	Confidence float64 `json:"confidence"`
	// Tie is present (true) when the top labels share the highest
	// confidence: the engine could not tell them apart, and label is the
	// first of them by name, not a decision.
	Tie    bool                     `json:"tie,omitempty"`
	Scores []classifiers.LabelScore `json:"scores"`
	tail
}

// classifyMulti is the answer in mode multi: the labels at or above the
// threshold, and every label by confidence.
type classifyMulti struct {
	Mode       string                   `json:"mode"`
	Classifier string                   `json:"classifier,omitempty"`
	Labels     []classifiers.LabelScore `json:"labels"`
	Threshold  float64                  `json:"threshold"`
	Scores     []classifiers.LabelScore `json:"scores"`
	tail
}

func (m *module) handleClassify(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	var body classifyBody
	if apiErr := decodeBody(ctx, &body, classifyExample, call.World.Config.Plugins, classifyTexts, classifyLabelSets, labelSetIs); apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	req, apiErr := body.request(call.World.Config)
	if apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		return
	}
	var res classifiers.ClassifyResult
	m.execute(ctx, call, execution{
		endpoint:    "/v1/classify",
		price:       call.World.Config.Plugins.Pricing.Classify,
		model:       body.Model,
		tokens:      int64(tokens.Count(req.Text)) + labelSetTokens(req.Labels, req.Descriptions, req.Examples),
		labels:      req.Labels,
		labelsField: "labels",
		classifier:  body.Classifier,
		run: func(ctx context.Context, e classifiers.Engine) (classifiers.Answer, error) {
			var err error
			res, err = e.Classify(ctx, req)
			return res.Answer, err
		},
		respond: func(t tail) any {
			if req.Mode == classifiers.ModeMulti {
				return classifyMulti{Mode: string(req.Mode), Classifier: body.Classifier, Labels: sortScores(res.Labels),
					Threshold: req.Threshold, Scores: sortScores(res.Scores), tail: t}
			}
			return classifySingle{Mode: string(req.Mode), Classifier: body.Classifier, Label: res.Label,
				Confidence: res.Confidence, Tie: res.Tie, Scores: sortScores(res.Scores), tail: t}
		},
	})
}
