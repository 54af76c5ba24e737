// Package catalog turns the models of gateway.yaml into the served catalog:
// the allow-list, the upstream each model maps to, exact prices, and the
// pre-rendered GET /v1/models and GET /v1/models/{id} bodies.
package catalog

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/money"
)

// Prices are a model's parsed prices per unit.
type Prices struct {
	Prompt, Completion, Image, Request, InputCacheRead money.Price
}

// Usage is what one call consumed. CompletionTokens includes ReasoningTokens,
// as upstreams report them; CachedTokens is the part of PromptTokens read
// from the prompt cache.
type Usage struct {
	PromptTokens     int64
	CachedTokens     int64
	CompletionTokens int64
	ReasoningTokens  int64
	Images           int64
	// Estimated: the counts are the tokenizer's, the upstream having
	// reported none to believe.
	Estimated bool
}

// Cost is the exact price of u: uncached prompt tokens at the prompt price,
// cached ones at input_cache_read, completion tokens (reasoning included) at
// the completion price, plus per-image and per-request prices. The sum is
// exact in atto-USD and rounded once, half up, to the nano-dollar.
func (p *Prices) Cost(u Usage) money.Nanos {
	var sum money.Atto
	cached := min(max(u.CachedTokens, 0), max(u.PromptTokens, 0))
	sum.Add(u.PromptTokens-cached, p.Prompt)
	sum.Add(cached, p.InputCacheRead)
	sum.Add(u.CompletionTokens, p.Completion)
	sum.Add(u.Images, p.Image)
	sum.Add(1, p.Request)
	return sum.Nanos()
}

// Entry is one served model.
type Entry struct {
	ID            string
	Upstream      string // the pool's first upstream, by its name in gateway.yaml
	Pool          []config.PoolMember
	UpstreamModel string // model name sent upstream
	// UpstreamModelJSON is UpstreamModel as a JSON string literal, spliced
	// into request bodies without re-encoding on every request.
	UpstreamModelJSON string
	Prices            Prices
	Config            config.Model

	json []byte // this entry as GET /v1/models lists it
}

// Catalog is immutable once built; a config reload builds a new one.
type Catalog struct {
	byID       map[string]*Entry
	ordered    []*Entry
	modelsJSON []byte
	validList  string
}

// New builds a catalog from validated config models.
func New(models []config.Model) (*Catalog, error) {
	c := &Catalog{byID: make(map[string]*Entry, len(models))}
	for _, m := range models {
		e := &Entry{ID: m.ID, Upstream: m.Upstream, Pool: m.Pool(), UpstreamModel: m.UpstreamModel, Config: m}
		if e.Upstream == "" && len(e.Pool) > 0 {
			e.Upstream = e.Pool[0].Name
		}
		if e.UpstreamModel == "" {
			e.UpstreamModel = m.ID
		}
		quoted, _ := json.Marshal(e.UpstreamModel)
		e.UpstreamModelJSON = string(quoted)
		var err error
		parse := func(field, s string) money.Price {
			if err != nil {
				return 0
			}
			if s == "" {
				return 0
			}
			var p money.Price
			p, err = money.ParsePrice(s)
			if err != nil {
				err = fmt.Errorf("model %s: pricing.%s: %w", m.ID, field, err)
			}
			return p
		}
		e.Prices = Prices{
			Prompt:         parse("prompt", m.Pricing.Prompt),
			Completion:     parse("completion", m.Pricing.Completion),
			Image:          parse("image", m.Pricing.Image),
			Request:        parse("request", m.Pricing.Request),
			InputCacheRead: parse("input_cache_read", m.Pricing.InputCacheRead),
		}
		if m.Pricing.InputCacheRead == "" {
			// No discount unless one is set: an upstream with prefix
			// caching reports cached tokens, and an omitted price made
			// them free. A written "0" is taken as written.
			e.Prices.InputCacheRead = e.Prices.Prompt
		}
		if err != nil {
			return nil, err
		}
		if _, dup := c.byID[m.ID]; dup {
			return nil, fmt.Errorf("model %s is listed twice", m.ID)
		}
		c.byID[m.ID] = e
		c.ordered = append(c.ordered, e)
	}
	// In GET /v1/models's order: sorted, it named the models otherwise
	// than that list and the plugin endpoints' 400 did.
	c.validList = ListIDs(c.IDs())
	// The list is assembled from the entries' own bytes, so GET
	// /v1/models/{id} answers exactly what the list says about id.
	list := []byte(`{"object":"list","data":[`)
	for i, e := range c.ordered {
		body, err := json.Marshal(e.view())
		if err != nil {
			return nil, err
		}
		e.json = body
		if i > 0 {
			list = append(list, ',')
		}
		list = append(list, body...)
	}
	c.modelsJSON = append(list, "]}"...)
	return c, nil
}

// Resolve returns the entry for a client-facing model id.
func (c *Catalog) Resolve(id string) (*Entry, bool) {
	e, ok := c.byID[id]
	return e, ok
}

// IDs lists model ids in config order.
func (c *Catalog) IDs() []string {
	ids := make([]string, len(c.ordered))
	for i, e := range c.ordered {
		ids[i] = e.ID
	}
	return ids
}

// Entries returns the served models in catalog order; do not modify.
func (c *Catalog) Entries() []*Entry { return c.ordered }

// ValidList is the id list, in catalog order, used in error messages
// (ListIDs).
func (c *Catalog) ValidList() string { return c.validList }

// listedInMessages is how many model ids an error message names: with
// 500 models, every 400 for a mistyped one was 6 KB of ids.
const listedInMessages = 20

// ListIDs is ids as an error message names them, comma-separated: all of
// them up to listedInMessages, else the first ones and how many more.
func ListIDs(ids []string) string {
	if len(ids) <= listedInMessages {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s … and %d more (GET /v1/models lists the catalog)", strings.Join(ids[:listedInMessages], ", "), len(ids)-listedInMessages)
}

// ModelsJSON is the GET /v1/models body, rendered once per catalog.
func (c *Catalog) ModelsJSON() []byte { return c.modelsJSON }

// ModelJSON is the GET /v1/models/{id} body: id's element of the list,
// rendered once per catalog. The caller MUST NOT modify it.
func (c *Catalog) ModelJSON(id string) ([]byte, bool) {
	e, ok := c.byID[id]
	if !ok {
		return nil, false
	}
	return e.json, true
}

type modelPricing struct {
	Prompt         string `json:"prompt"`
	Completion     string `json:"completion"`
	Image          string `json:"image"`
	Request        string `json:"request"`
	InputCacheRead string `json:"input_cache_read"`
}

type modelView struct {
	ID                          string       `json:"id"`
	Object                      string       `json:"object"`
	Created                     int64        `json:"created"`
	OwnedBy                     string       `json:"owned_by"`
	HuggingFaceID               string       `json:"hugging_face_id"`
	Name                        string       `json:"name"`
	InputModalities             []string     `json:"input_modalities"`
	OutputModalities            []string     `json:"output_modalities"`
	Quantization                string       `json:"quantization"`
	ContextLength               int          `json:"context_length"`
	MaxOutputLength             int          `json:"max_output_length"`
	Pricing                     modelPricing `json:"pricing"`
	SupportedFeatures           []string     `json:"supported_features"`
	SupportedSamplingParameters []string     `json:"supported_sampling_parameters"`
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (e *Entry) view() modelView {
	m := e.Config
	return modelView{
		ID:               m.ID,
		Object:           "model",
		Created:          int64(m.Created),
		OwnedBy:          "tollgate",
		HuggingFaceID:    m.HuggingFaceID,
		Name:             m.Name,
		InputModalities:  nonNil(m.InputModalities),
		OutputModalities: nonNil(m.OutputModalities),
		Quantization:     m.Quantization,
		ContextLength:    m.ContextLength,
		MaxOutputLength:  m.MaxOutputLength,
		Pricing: modelPricing{
			Prompt:         e.Prices.Prompt.String(),
			Completion:     e.Prices.Completion.String(),
			Image:          e.Prices.Image.String(),
			Request:        e.Prices.Request.String(),
			InputCacheRead: e.Prices.InputCacheRead.String(),
		},
		SupportedFeatures:           nonNil(m.SupportedFeatures),
		SupportedSamplingParameters: nonNil(m.SupportedSamplingParameters),
	}
}
