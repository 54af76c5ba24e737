package catalog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/money"
)

func model(id string, p config.Pricing) config.Model {
	return config.Model{ID: id, Upstream: "u", Pricing: p, ContextLength: 10, MaxOutputLength: 5}
}

func TestCostIsExact(t *testing.T) {
	c, err := New([]config.Model{model("m", config.Pricing{
		Prompt: "0.0000005", Completion: "0.000002", InputCacheRead: "0.00000025", Image: "0.001", Request: "0.0001",
	})})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := c.Resolve("m")
	// 900 uncached*0.5e-6 + 100 cached*0.25e-6 + 300*2e-6 (reasoning 200 included) + 2 images*1e-3 + 1e-4
	got := e.Prices.Cost(Usage{PromptTokens: 1000, CachedTokens: 100, CompletionTokens: 300, ReasoningTokens: 200, Images: 2})
	want := money.Nanos(450_000 + 25_000 + 600_000 + 2_000_000 + 100_000)
	if got != want {
		t.Fatalf("cost %d, want %d", got, want)
	}
	// cached tokens beyond the prompt cannot make the cost negative
	if got := e.Prices.Cost(Usage{PromptTokens: 10, CachedTokens: 50}); got != 10*250+100_000 {
		t.Fatalf("cost %d", got)
	}
}

// Without input_cache_read, cached tokens cost the prompt price: an
// upstream with prefix caching reports them, and an omitted price made them
// free. "0" written is a free cache read, as the operator asked.
func TestCachedTokensWithoutACachePriceCostThePromptPrice(t *testing.T) {
	c, err := New([]config.Model{
		model("nocache", config.Pricing{Prompt: "0.000001", Completion: "0.000002"}),
		model("freecache", config.Pricing{Prompt: "0.000001", Completion: "0.000002", InputCacheRead: "0"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	u := Usage{PromptTokens: 10, CachedTokens: 8, CompletionTokens: 20}
	if e, _ := c.Resolve("nocache"); e.Prices.Cost(u) != 10*1000+20*2000 {
		t.Fatalf("no cache price: cost %d, want the 8 cached tokens at the prompt price", e.Prices.Cost(u))
	}
	if e, _ := c.Resolve("freecache"); e.Prices.Cost(u) != 2*1000+20*2000 {
		t.Fatalf("cache price 0: cost %d", e.Prices.Cost(u))
	}
}

func TestCatalogRendersSpecShape(t *testing.T) {
	c, err := New([]config.Model{model("b", config.Pricing{Prompt: "0.0000001"}), model("a", config.Pricing{})})
	if err != nil {
		t.Fatal(err)
	}
	if c.ValidList() != "b, a" {
		t.Fatalf("valid list %q, want the config's order, as the list below", c.ValidList())
	}
	var list struct {
		Object string                   `json:"object"`
		Data   []map[string]interface{} `json:"data"`
	}
	if err := json.Unmarshal(c.ModelsJSON(), &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || list.Data[0]["id"] != "b" {
		t.Fatalf("%s", c.ModelsJSON())
	}
	for _, f := range []string{"id", "hugging_face_id", "name", "input_modalities", "output_modalities", "quantization", "context_length", "max_output_length", "pricing", "supported_features", "supported_sampling_parameters"} {
		if _, ok := list.Data[0][f]; !ok {
			t.Errorf("field %s missing", f)
		}
	}
	pricing := list.Data[0]["pricing"].(map[string]interface{})
	if pricing["prompt"] != "0.0000001" || pricing["image"] != "0" {
		t.Fatalf("pricing %v", pricing)
	}
	if _, err := New([]config.Model{model("x", config.Pricing{Prompt: "1e-6"})}); err == nil {
		t.Fatal("float-style price accepted")
	}
	if _, err := New([]config.Model{model("x", config.Pricing{}), model("x", config.Pricing{})}); err == nil {
		t.Fatal("duplicate id accepted")
	}
}

// GET /v1/models/{id} must answer byte for byte what the list holds for id,
// slashes in the id included.
func TestModelJSONIsTheListElement(t *testing.T) {
	c, err := New([]config.Model{model("Qwen/Qwen2.5-7B", config.Pricing{Prompt: "0.0000001"}), model("a", config.Pricing{})})
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(c.ModelsJSON(), &list); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"Qwen/Qwen2.5-7B", "a"} {
		got, ok := c.ModelJSON(id)
		if !ok || string(got) != string(list.Data[i]) {
			t.Errorf("ModelJSON(%q) = %s, %v; the list has %s", id, got, ok, list.Data[i])
		}
	}
	if _, ok := c.ModelJSON("Qwen"); ok {
		t.Error("a prefix of an id was found")
	}
	empty, err := New(nil)
	if err != nil || string(empty.ModelsJSON()) != `{"object":"list","data":[]}` {
		t.Fatalf("empty catalog: %s, %v", empty.ModelsJSON(), err)
	}
}

// GET /v1/models shows each model's configured created, in Unix seconds
// as OpenAI's Model.created; an undated model shows 0. Every model showed
// 0, which an SDK user sorting by created to find the newest could not use.
func TestModelsShowTheirCreated(t *testing.T) {
	dated := model("dated", config.Pricing{})
	dated.Created = 1737936000 // 2025-01-27
	c, err := New([]config.Model{dated, model("undated", config.Pricing{})})
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID      string `json:"id"`
			Created int64  `json:"created"`
		} `json:"data"`
	}
	if err := json.Unmarshal(c.ModelsJSON(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 2 || list.Data[0].Created != 1737936000 || list.Data[1].Created != 0 {
		t.Fatalf("%s", c.ModelsJSON())
	}
	if one, _ := c.ModelJSON("dated"); !bytes.Contains(one, []byte(`"created":1737936000,`)) {
		t.Fatalf("GET /v1/models/dated: %s", one)
	}
}

// TestLargestCallOfAcceptedPricesIsBilled: a model of completion "0.02"
// passed config check, and a call whose upstream reported 60,000,000
// completion tokens cost 1,200,000 USD, which billing refuses for one
// event: the call went unbilled. At prices config accepts, the costliest
// call the gateway believes costs no more than billing accepts.
func TestLargestCallOfAcceptedPricesIsBilled(t *testing.T) {
	const head = "upstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n" +
		"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n    pricing: "
	// Each accepted pricing is at the bound: its largest call costs a
	// nano-dollar more with the refused one.
	for pricing, refused := range map[string]string{
		`{prompt: "0.005", completion: "0.005"}`: `{prompt: "0.005", completion: "0.00500000000000001"}`,
		`{prompt: "0.001", input_cache_read: "0.004999999999999999", completion: "0.005", request: "0.0000000001"}`: `{prompt: "0.001", input_cache_read: "0.00500000000000001", completion: "0.005", request: "0.0000000001"}`,
		`{prompt: "0.002", completion: "0.002", image: "1.430512838852728703"}`:                                     `{prompt: "0.002", completion: "0.002", image: "1.43051283885273"}`,
		`{prompt: "0", completion: "0", request: "18.446744073709551615"}`:                                          `{prompt: "0", completion: "0.02"}`,
	} {
		if _, err := config.Parse("gateway.yaml", []byte(head+refused)); err == nil {
			t.Errorf("%s was accepted", refused)
		}
		cfg, err := config.Parse("gateway.yaml", []byte(head+pricing))
		if err != nil {
			t.Fatalf("%s: %v", pricing, err)
		}
		c, err := New(cfg.Models)
		if err != nil {
			t.Fatal(err)
		}
		e, _ := c.Resolve("m")
		images := int64(cfg.Server.MaxRequestBody) / int64(len(`{"type":"image_url"}`))
		for _, cached := range []int64{0, config.MaxReportedTokens} {
			u := Usage{PromptTokens: config.MaxReportedTokens, CachedTokens: cached, CompletionTokens: config.MaxReportedTokens, Images: images}
			if cost := e.Prices.Cost(u); cost > money.MaxEventCost {
				t.Errorf("%s, %d cached: the largest call costs %s USD, more than billing accepts (%s)", pricing, cached, cost, money.MaxEventCost)
			}
		}
	}
}

func TestListIDsNamesTwentyAndHowManyMore(t *testing.T) {
	var ids []string
	for i := range 22 {
		ids = append(ids, fmt.Sprintf("m%02d", i))
	}
	if got, want := ListIDs(ids[:20]), strings.Join(ids[:20], ", "); got != want {
		t.Errorf("ListIDs of 20 = %q, want them all: %q", got, want)
	}
	if got, want := ListIDs(ids), strings.Join(ids[:20], ", ")+" … and 2 more (GET /v1/models lists the catalog)"; got != want {
		t.Errorf("ListIDs of 22 = %q, want %q", got, want)
	}
}
