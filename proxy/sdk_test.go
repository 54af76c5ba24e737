package proxy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate/tollgate/proxy/proxytest"
)

// The official Go SDK pointed at the gateway works as it does against
// OpenAI: chat and responses, streamed and not, and its typed errors.
func TestOfficialGoSDK(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 5, PromptTokens: 8, CompletionTokens: 5}})
	client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
	ctx := t.Context()

	chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "small",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if chat.Choices[0].Message.Content == "" || chat.Usage.PromptTokens != 8 {
		t.Fatalf("chat %+v", chat)
	}

	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "small",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(acc.Choices[0].Message.Content, "tok0 tok1") || acc.Usage.CompletionTokens != 5 {
		t.Fatalf("accumulated %+v", acc.ChatCompletion)
	}

	resp, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "large",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() == "" || resp.Usage.InputTokens != 8 {
		t.Fatalf("response %+v", resp)
	}
	rs := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "large",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	})
	var text strings.Builder
	completed := false
	for rs.Next() {
		ev := rs.Current()
		text.WriteString(ev.Delta)
		if ev.Type == "response.completed" {
			completed = ev.Response.Usage.OutputTokens == 5
		}
	}
	if rs.Err() != nil || !completed || !strings.HasPrefix(text.String(), "tok0") {
		t.Fatalf("responses stream: err %v completed %v text %q", rs.Err(), completed, text.String())
	}

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "invalid_request_error" || !strings.Contains(apiErr.Message, "small") {
		t.Fatalf("unknown model: %v", err)
	}
	bad := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey("sk-wrong"), option.WithMaxRetries(0))
	_, err = bad.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "small", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "INVALID_API_KEY" {
		t.Fatalf("bad key: %v", err)
	}
	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 2 || models.Data[0].ID != "small" {
		t.Fatalf("models: %v %+v", err, models)
	}
	h.events(4)
}

// client.Models.Get is GET /v1/models/{id}: the SDK decodes the catalog
// entry, and an unknown id raises the SDK's 404 with OpenAI's code.
func TestOfficialGoSDKRetrievesModel(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
	m, err := client.Models.Get(t.Context(), "large")
	if err != nil || m.ID != "large" || m.Object != "model" || m.OwnedBy != "tollgate" {
		t.Fatalf("large: %v %+v", err, m)
	}
	if !strings.Contains(m.RawJSON(), `"context_length":262144`) {
		t.Fatalf("catalog fields missing: %s", m.RawJSON())
	}
	_, err = client.Models.Get(t.Context(), "gpt-9")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" || apiErr.Param != "model" || apiErr.Message != "The model 'gpt-9' does not exist" {
		t.Fatalf("unknown model: %v", err)
	}
}

// A stream the upstream cuts reaches the SDK as an error, not as a
// complete answer.
func TestOfficialGoSDKSeesCutStream(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 10, DropAfter: 3}})
	client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:    "small",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	})
	n := 0
	for stream.Next() {
		n++
	}
	if stream.Err() == nil || !strings.Contains(stream.Err().Error(), "interrupted") {
		t.Fatalf("after %d chunks: err %v", n, stream.Err())
	}
}
