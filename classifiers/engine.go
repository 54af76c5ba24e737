// Package classifiers holds the classification engines behind classify,
// tag, score, match and batch: "lexical" (offline, deterministic) and
// "llm" (prompts a catalog model through the gateway's upstream client).
package classifiers

import (
	"context"

	"github.com/tollgate/tollgate/catalog"
)

// Confidences and scores are probabilities in [0,1]; they are float64
// because they are not money.

// Mode selects one label or several.
type Mode string

const (
	ModeSingle Mode = "single"
	ModeMulti  Mode = "multi"
)

// ClassifyRequest is a validated classify call (or one batch line).
type ClassifyRequest struct {
	Text         string
	Labels       []string            // 1..200, unique, non-empty
	Descriptions map[string]string   // per label, optional
	Examples     map[string][]string // per label, optional
	TextType     string              // context for prompt tuning, optional
	Mode         Mode
	Threshold    float64 // multi mode: labels at or above it are returned
}

// LabelScore is one label with its confidence.
type LabelScore struct {
	Label      string  `json:"label"`
	Confidence float64 `json:"confidence"`
}

// Usage is the tokens an engine spent; lexical engines count the input
// with the tokenizer and report no completion tokens.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// CachedTokens and ReasoningTokens are the parts of an llm's prompt
	// and completion tokens its upstream reported cached and reasoning,
	// as CallModel read them (each no more than the count it is part
	// of). They go on the usage event, and cached tokens cost the
	// model's input_cache_read: dropped here, they were billed at the
	// full prompt price and recorded as 0. The plugins' answers show
	// them as a chat completion does (prompt_tokens_details.cached_tokens,
	// completion_tokens_details.reasoning_tokens), when not 0.
	CachedTokens    int64 `json:"-"`
	ReasoningTokens int64 `json:"-"`
	// Estimated: some of an llm's tokens are the tokenizer's count, its
	// upstream having reported none to believe (the event says so).
	Estimated bool `json:"-"`
}

// Plus is the tokens of u and v together.
func (u Usage) Plus(v Usage) Usage {
	return Usage{PromptTokens: u.PromptTokens + v.PromptTokens, CompletionTokens: u.CompletionTokens + v.CompletionTokens,
		TotalTokens: u.TotalTokens + v.TotalTokens, CachedTokens: u.CachedTokens + v.CachedTokens,
		ReasoningTokens: u.ReasoningTokens + v.ReasoningTokens, Estimated: u.Estimated || v.Estimated}
}

// Tokens is u's total: prompt and completion when it gives none.
func (u Usage) Tokens() int64 {
	if u.TotalTokens == 0 {
		return u.PromptTokens + u.CompletionTokens
	}
	return u.TotalTokens
}

// addCall adds the usage of one model call, as CallModel returned it.
func (u *Usage) addCall(c catalog.Usage) {
	u.PromptTokens += c.PromptTokens
	u.CompletionTokens += c.CompletionTokens
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.CachedTokens += c.CachedTokens
	u.ReasoningTokens += c.ReasoningTokens
	u.Estimated = u.Estimated || c.Estimated
}

// Catalog is u as a model's prices read it (catalog.Prices.Cost).
func (u Usage) Catalog() catalog.Usage {
	return catalog.Usage{PromptTokens: u.PromptTokens, CachedTokens: u.CachedTokens, CompletionTokens: u.CompletionTokens,
		ReasoningTokens: u.ReasoningTokens, Estimated: u.Estimated}
}

// Answer says which engine and model produced a result.
type Answer struct {
	Engine string `json:"engine"`          // "semantic", "lexical" or "llm"
	Model  string `json:"model,omitempty"` // catalog model for llm
	Usage  Usage  `json:"usage"`
	// NoLogprobs says the upstream returned no log-probabilities: the
	// answer is the model's, but its confidences or score carry no
	// measure of how sure the model was (llm engine, see NewLLM).
	NoLogprobs bool `json:"no_logprobs,omitempty"`
}

// ClassifyResult: in single mode Label/Confidence is the best label and
// Scores every label, sorted by confidence descending; in multi mode Labels
// holds those at or above the threshold (sorted) and Scores every label.
//
// Tie (single mode) says the engine could not separate the top labels:
// two or more share the highest confidence, and Label is the first of
// them by name, not a decision. The lexical engine ties when no label
// shares a word with the text; the llm engine when the model gave two
// labels' numbers the same probability (to 4 decimals).
type ClassifyResult struct {
	Label      string       `json:"label,omitempty"`
	Confidence float64      `json:"confidence,omitempty"`
	Tie        bool         `json:"tie,omitempty"`
	Labels     []LabelScore `json:"labels,omitempty"`
	Scores     []LabelScore `json:"scores"`
	Answer
}

// TagRequest tags text from a closed set (Tags) or, when Tags is empty,
// with open tags the engine finds.
type TagRequest struct {
	Text    string
	Tags    []string
	MaxTags int // default 5
	// Threshold: only tags of at least this confidence are returned, open
	// or closed; 0 keeps every tag with evidence. The API's default for a
	// closed set, 0.5, is DefaultTagThreshold, set by the caller: an
	// engine reading 0 as "default" turned a client's explicit 0 into 0.5.
	Threshold float64
}

// DefaultTagThreshold is /v1/tag's threshold for a closed set of tags.
const DefaultTagThreshold = 0.5

// TagResult lists tags by confidence, descending.
type TagResult struct {
	Tags []LabelScore `json:"tags"`
	Answer
}

// ScoreRequest scores Source on Attribute (any name; common ones: urgency,
// toxicity, sentiment, formality, quality, spam).
type ScoreRequest struct {
	Source      string
	Attribute   string
	Description string
}

// MatchRequest scores how relevant Source is to Query.
type MatchRequest struct {
	Source string
	Query  string
}

// ScoreResult is a score in [0,1].
//
// NoEvidence says an offline engine had nothing to measure by. For Score:
// the attribute is not one of its own, no word of its name or description
// has a vector, and none is shared with the text. For Match: the query or
// the source has no word (no letter or digit). Score is then 0, which
// would otherwise read as "not at all". The llm engine never sets it: a
// model's digit is its judgement.
type ScoreResult struct {
	Score      float64 `json:"score"`
	NoEvidence bool    `json:"no_evidence,omitempty"`
	Answer
}

// Engine is one classification engine. Implementations are safe for
// concurrent use.
type Engine interface {
	Name() string
	Classify(ctx context.Context, req ClassifyRequest) (ClassifyResult, error)
	Tag(ctx context.Context, req TagRequest) (TagResult, error)
	Score(ctx context.Context, req ScoreRequest) (ScoreResult, error)
	Match(ctx context.Context, req MatchRequest) (ScoreResult, error)
}

// ModelCaller sends a non-streamed chat completion to a catalog model;
// proxy.(*World).CallModel implements it.
type ModelCaller interface {
	CallModel(ctx context.Context, model string, body []byte) ([]byte, catalog.Usage, error)
}
