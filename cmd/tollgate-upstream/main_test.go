package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/internal/testutil"
)

// caller posts the llm engine's calls to the demo upstream over TCP.
type caller struct{ url string }

func (c caller) CallModel(ctx context.Context, model string, body []byte) ([]byte, catalog.Usage, error) {
	var u catalog.Usage
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, u, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, u, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, u, fmt.Errorf("status %d, %v: %s", resp.StatusCode, err, raw)
	}
	u.PromptTokens = gjson.GetBytes(raw, "usage.prompt_tokens").Int()
	u.CompletionTokens = gjson.GetBytes(raw, "usage.completion_tokens").Int()
	return raw, u, nil
}

func startDemo(t *testing.T, args ...string) classifiers.Engine {
	t.Helper()
	var out bytes.Buffer
	s, err := start(append([]string{"-addr", "127.0.0.1:0"}, args...), &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if got := strings.TrimSpace(out.String()); got != s.URL {
		t.Errorf("printed %q, want the base URL %s", got, s.URL)
	}
	return classifiers.NewLLM(caller{s.URL}, "qwen2.5-14b-instruct-1m")
}

// TestIssue11DemoUpstreamAnswersAsTheOfflineEngine runs the demo upstream
// as `make demo-upstream` does and checks the llm engine's answers through
// it against the offline engine's.
func TestIssue11DemoUpstreamAnswersAsTheOfflineEngine(t *testing.T) {
	llm, lex := startDemo(t, "-vectors", ""), offlineView("", t.Logf)
	ctx := context.Background()
	req := classifiers.ClassifyRequest{Text: "Where is my parcel? It was due on Monday.", Labels: []string{"billing", "shipping"},
		Descriptions: map[string]string{"shipping": "delivery of parcels and orders"}, Mode: classifiers.ModeSingle}
	got, err := llm.Classify(ctx, req)
	want, _ := lex.Classify(ctx, req)
	if err != nil || got.Label != "shipping" || got.Label != want.Label || got.Confidence != want.Confidence || got.NoLogprobs {
		t.Errorf("classify: llm %+v, %v; lexical %+v", got, err, want)
	}
	sreq := classifiers.ScoreRequest{Source: "URGENT: the site is down!", Attribute: "urgency"}
	s, err := llm.Score(ctx, sreq)
	ws, _ := lex.Score(ctx, sreq)
	if err != nil || s.Score < ws.Score-1e-3 || s.Score > ws.Score+1e-3 || s.Engine != "llm" {
		t.Errorf("score: llm %+v, %v; lexical %.4f", s, err, ws.Score)
	}
}

func TestDemoUpstreamWithoutLogprobs(t *testing.T) {
	llm := startDemo(t, "-no-logprobs", "-vectors", "")
	got, err := llm.Classify(context.Background(), classifiers.ClassifyRequest{Text: "my parcel is late", Labels: []string{"billing", "shipping"},
		Descriptions: map[string]string{"shipping": "delivery of parcels"}, Mode: classifiers.ModeSingle})
	if err != nil || got.Label != "shipping" || !got.NoLogprobs || got.Confidence != 0.5 {
		t.Errorf("classify %+v, %v: want the view's label at 1/2, flagged", got, err)
	}
}

// TestDemoUpstreamAnswersFromTheSemanticEngine: with the word vectors
// installed (make test installs them), the demo answers classifier
// prompts as the semantic engine does, so the issue's own example, where
// no label shares a word with the text, is no tie through the demo
// either, in both label orders.
func TestDemoUpstreamAnswersFromTheSemanticEngine(t *testing.T) {
	path, err := testutil.VectorsPath()
	if err != nil {
		t.Fatal(err)
	}
	llm, sem := startDemo(t, "-vectors", path), offlineView(path, t.Errorf)
	if sem.Name() != classifiers.EngineSemantic {
		t.Fatalf("offline view over %s is %s, want semantic", path, sem.Name())
	}
	ctx := context.Background()
	for _, labels := range [][]string{{"billing", "bug"}, {"bug", "billing"}} {
		req := classifiers.ClassifyRequest{Text: "The export button crashes", Labels: labels, Mode: classifiers.ModeSingle}
		got, err := llm.Classify(ctx, req)
		want, _ := sem.Classify(ctx, req)
		if err != nil || got.Label != "bug" || got.Tie || got.Label != want.Label || got.Confidence != want.Confidence {
			t.Errorf("classify %v: llm %+v, %v; semantic %+v", labels, got, err, want)
		}
	}
}

func TestDemoUpstreamWithoutVectorsIsLexical(t *testing.T) {
	var logged []string
	e := offlineView(filepath.Join(t.TempDir(), "missing.tgv"), func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) })
	if e.Name() != classifiers.EngineLexical || len(logged) != 1 || !strings.Contains(logged[0], "scripts/vectors.sh install") {
		t.Errorf("missing vectors: engine %s, logged %q; want lexical and one line saying how to install them", e.Name(), logged)
	}
}

// The failure flags make the demo upstream a failing pool member: an
// error status with its Retry-After, a stream cut after some events.
func TestDemoUpstreamFails(t *testing.T) {
	for _, c := range []struct {
		args       []string
		stream     bool
		status     int
		retryAfter string
		body       string
	}{
		{args: []string{"-status", "429", "-retry-after", "5"}, status: 429, retryAfter: "5", body: `"error"`},
		{args: []string{"-drop-after", "3", "-chunks", "10"}, stream: true, status: 200, body: "data: "},
	} {
		var out bytes.Buffer
		s, err := start(append([]string{"-addr", "127.0.0.1:0", "-vectors", ""}, c.args...), &out)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
		if c.stream {
			body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		resp, err := http.Post(s.URL+"/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, readErr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Retry-After") != c.retryAfter || !strings.Contains(string(got), c.body) {
			t.Errorf("%v: %d, Retry-After %q, %s", c.args, resp.StatusCode, resp.Header.Get("Retry-After"), got)
		}
		if c.stream && (readErr == nil || strings.Contains(string(got), "[DONE]") || strings.Count(string(got), "data: ") != 3) {
			t.Errorf("%v: the stream was not cut after 3 events (%v): %s", c.args, readErr, got)
		}
	}
}
