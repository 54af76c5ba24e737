package meter

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/money"
)

func TestAppendJSONDecodesLikeEncodingJSON(t *testing.T) {
	for _, ev := range []*Event{
		outboxTestEvent(3),
		{
			ID: "01a2-\"quoted\"\\", Time: time.Date(2026, 11, 24, 7, 1, 2, 3456, time.UTC), Account: "acme\n\t",
			KeyID: "key_<&>", Endpoint: "/v1/chat/completions", Model: "m\u2028x", Upstream: "up\x01",
			PromptTokens: 1, CachedTokens: 2, CompletionTokens: 3, ReasoningTokens: 4, Images: 5,
			CostNanos: money.Nanos(-7), UsageSource: SourceEstimated, Status: 502, Latency: time.Second,
			TTFB: time.Millisecond, Stream: true, JobID: "job-1",
			Log: &RequestLog{Request: `{"a":"b"}` + "\xff\xfe", Response: "héllo 🎉", RetentionDays: 30},
		},
		{ID: "x", Time: time.Date(2025, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600))},
	} {
		got := ev.AppendJSON(nil)
		if !json.Valid(got) {
			t.Fatalf("invalid JSON: %s", got)
		}
		want, _ := json.Marshal(ev)
		var a, b Event
		if err := json.Unmarshal(got, &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(want, &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("decoded\n%+v\nwant\n%+v\n(%s)", a, b, got)
		}
		var am, bm map[string]any
		_ = json.Unmarshal(got, &am)
		_ = json.Unmarshal(want, &bm)
		if !reflect.DeepEqual(am, bm) {
			t.Fatalf("fields differ:\n%s\n%s", got, want)
		}
	}
}

func TestAppendJSONAllocatesNothing(t *testing.T) {
	ev := outboxTestEvent(1)
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { buf = ev.AppendJSON(buf[:0]) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
