package billing_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// clickHouseTestEvents returns n distinct events spread over a few
// accounts, keys, models and two months, with every field set.
func clickHouseTestEvents(t testing.TB, n int) []*meter.Event {
	t.Helper()
	base := time.Date(2025, 1, 10, 20, 0, 0, 0, time.UTC) // 5000 events stay in January
	events := make([]*meter.Event, n)
	for i := range events {
		id, err := uuid.NewV7()
		if err != nil {
			t.Fatal(err)
		}
		events[i] = &meter.Event{
			ID:               id.String(),
			Time:             base.Add(time.Duration(i) * 37 * time.Second),
			Account:          fmt.Sprintf("acct-%d", i%3),
			KeyID:            fmt.Sprintf("key-%d", i%7),
			Endpoint:         []string{"/v1/chat/completions", "/v1/responses"}[i%2],
			Model:            []string{"small", "vision", "reasoner"}[i%3],
			Upstream:         "local",
			PromptTokens:     int64(100 + i),
			CachedTokens:     int64(i % 50),
			CompletionTokens: int64(20 + i%200),
			ReasoningTokens:  int64(i % 13),
			Images:           int64(i % 2),
			CostNanos:        money.Nanos(1_234_567 + int64(i)*1_000_003),
			UsageSource:      []meter.UsageSource{meter.SourceUpstream, meter.SourceEstimated}[i%2],
			Status:           200,
			Latency:          time.Duration(1500+i) * time.Millisecond,
			TTFB:             time.Duration(80+i) * time.Millisecond,
			Stream:           i%2 == 0,
			JobID:            []string{"", "job-1"}[i%2],
		}
	}
	return events
}

func openClickHouseSink(t testing.TB, srv *chtest.Server) *billing.ClickHouseSink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := billing.OpenClickHouse(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return sink
}

type clickHouseTotals struct {
	Count                                       uint64
	Prompt, Cached, Completion, Reasoning, Imgs int64
	Cost                                        int64
}

func clickHouseTotalsOf(events []*meter.Event) clickHouseTotals {
	var want clickHouseTotals
	for _, ev := range events {
		want.Count++
		want.Prompt += ev.PromptTokens
		want.Cached += ev.CachedTokens
		want.Completion += ev.CompletionTokens
		want.Reasoning += ev.ReasoningTokens
		want.Imgs += ev.Images
		want.Cost += int64(ev.CostNanos)
	}
	return want
}

func queryClickHouseTotals(t testing.TB, sink *billing.ClickHouseSink, from string) clickHouseTotals {
	t.Helper()
	var got clickHouseTotals
	row := sink.Conn().QueryRow(context.Background(), `SELECT count(), sum(prompt_tokens), sum(cached_tokens),
		sum(completion_tokens), sum(reasoning_tokens), sum(images), sum(cost_nanos) FROM `+from)
	if err := row.Scan(&got.Count, &got.Prompt, &got.Cached, &got.Completion, &got.Reasoning, &got.Imgs, &got.Cost); err != nil {
		t.Fatalf("totals of %s: %v", from, err)
	}
	return got
}

func TestClickHouseSinkRedeliveredEventsAreBilledOnce(t *testing.T) {
	srv := chtest.Start(t)
	sink := openClickHouseSink(t, srv)
	ctx := context.Background()
	events := clickHouseTestEvents(t, 1000)
	want := clickHouseTotalsOf(events)

	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	if got := queryClickHouseTotals(t, sink, "usage_events FINAL"); got != want {
		t.Fatalf("after the first insert: got %+v, want %+v", got, want)
	}

	// JetStream redelivers a batch whose ack was lost after the INSERT.
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	if got := queryClickHouseTotals(t, sink, "usage_events"); got.Count != 2*want.Count {
		t.Fatalf("without FINAL the copies should still be there (else this test proves nothing): %d rows", got.Count)
	}
	if got := queryClickHouseTotals(t, sink, "usage_events FINAL"); got != want {
		t.Fatalf("after redelivery: got %+v, want %+v", got, want)
	}
	var rollup clickHouseTotals
	if err := sink.Conn().QueryRow(ctx, `SELECT sum(requests), sum(prompt_tokens), sum(cached_tokens),
		sum(completion_tokens), sum(reasoning_tokens), sum(images), sum(cost_nanos) FROM usage_daily`).
		Scan(&rollup.Count, &rollup.Prompt, &rollup.Cached, &rollup.Completion, &rollup.Reasoning, &rollup.Imgs, &rollup.Cost); err != nil {
		t.Fatal(err)
	}
	if rollup != want {
		t.Fatalf("daily rollup after redelivery: got %+v, want %+v", rollup, want)
	}

	// Merging must keep one row per event too: the dedup key is the event's.
	for _, table := range []string{"usage_events", "usage_daily_events"} {
		if err := sink.Conn().Exec(ctx, "OPTIMIZE TABLE "+table+" FINAL"); err != nil {
			t.Fatal(err)
		}
	}
	if got := queryClickHouseTotals(t, sink, "usage_events"); got != want {
		t.Fatalf("after merging: got %+v, want %+v", got, want)
	}
	if got := queryClickHouseTotals(t, sink, "usage_daily_events"); got != want {
		t.Fatalf("rollup rows after merging: got %+v, want %+v", got, want)
	}
}

func TestClickHouseSinkStoresEveryField(t *testing.T) {
	srv := chtest.Start(t)
	sink := openClickHouseSink(t, srv)
	ctx := context.Background()
	events := clickHouseTestEvents(t, 2)
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	for _, want := range events {
		var got meter.Event
		var cost int64
		var status uint16
		var latencyUS, ttfbUS uint64
		var stream uint8
		var source string
		var date time.Time
		err := sink.Conn().QueryRow(ctx, `SELECT id, time, date, account, key_id, endpoint, model, upstream,
			prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, images, cost_nanos,
			usage_source, status, latency_us, ttfb_us, stream, job_id
			FROM usage_events FINAL WHERE id = ?`, want.ID).Scan(
			&got.ID, &got.Time, &date, &got.Account, &got.KeyID, &got.Endpoint, &got.Model, &got.Upstream,
			&got.PromptTokens, &got.CachedTokens, &got.CompletionTokens, &got.ReasoningTokens, &got.Images, &cost,
			&source, &status, &latencyUS, &ttfbUS, &stream, &got.JobID)
		if err != nil {
			t.Fatal(err)
		}
		got.Time = got.Time.UTC()
		got.CostNanos = money.Nanos(cost)
		got.UsageSource = meter.UsageSource(source)
		got.Status = int(status)
		got.Latency = time.Duration(latencyUS) * time.Microsecond
		got.TTFB = time.Duration(ttfbUS) * time.Microsecond
		got.Stream = stream == 1
		if !reflect.DeepEqual(&got, want) {
			t.Errorf("stored event differs:\n got %+v\nwant %+v", got, *want)
		}
		if wantDate := want.Time.UTC().Format(time.DateOnly); date.Format(time.DateOnly) != wantDate {
			t.Errorf("event %s at %v: date %v, want the UTC day %s", want.ID, want.Time, date, wantDate)
		}
	}
}

func TestClickHouseSinkRejectsEventsItCannotStoreExactly(t *testing.T) {
	srv := chtest.Start(t)
	sink := openClickHouseSink(t, srv)
	ctx := context.Background()
	for name, mutate := range map[string]func(*meter.Event){
		"no id":       func(ev *meter.Event) { ev.ID = "" },
		"before 1970": func(ev *meter.Event) { ev.Time = time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC) },
		"status":      func(ev *meter.Event) { ev.Status = 70000 },
	} {
		events := clickHouseTestEvents(t, 3)
		mutate(events[1])
		if err := sink.Insert(ctx, events); !errors.Is(err, billing.ErrInvalidEvent) {
			t.Errorf("%s: got %v, want ErrInvalidEvent", name, err)
		}
	}
	if err := sink.Insert(ctx, []*meter.Event{nil}); !errors.Is(err, billing.ErrInvalidEvent) {
		t.Errorf("nil event: got %v, want ErrInvalidEvent", err)
	}
	if got := queryClickHouseTotals(t, sink, "usage_events"); got.Count != 0 {
		t.Errorf("a rejected batch wrote %d rows", got.Count)
	}
	if err := sink.Insert(ctx, nil); err != nil {
		t.Errorf("empty batch: %v", err)
	}
}

func TestOpenClickHouseRefusesHTTP(t *testing.T) {
	_, err := billing.OpenClickHouse(context.Background(), "http://127.0.0.1:8123/default")
	if !errors.Is(err, billing.ErrClickHouseNotNative) {
		t.Fatalf("got %v, want ErrClickHouseNotNative", err)
	}
}

func TestClickHouseSinkInsertFailsFastWhileServerIsDownAndWorksAfterRestart(t *testing.T) {
	srv := chtest.Start(t)
	sink := openClickHouseSink(t, srv)
	before := clickHouseTestEvents(t, 10)
	if err := sink.Insert(context.Background(), before); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	const bound = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	began := time.Now()
	err := sink.Insert(ctx, clickHouseTestEvents(t, 10))
	cancel()
	if err == nil {
		t.Fatal("insert into a stopped server succeeded")
	}
	if took := time.Since(began); took > bound {
		t.Fatalf("insert into a stopped server took %v", took)
	}
	t.Logf("insert while stopped failed after %v: %v", time.Since(began).Round(time.Millisecond), err)

	srv.Restart()
	after := clickHouseTestEvents(t, 10)
	if err := sink.Insert(context.Background(), after); err != nil {
		t.Fatalf("first insert after restart: %v", err)
	}
	want := clickHouseTotalsOf(append(before, after...))
	if got := queryClickHouseTotals(t, sink, "usage_events FINAL"); got != want {
		t.Fatalf("after restart: got %+v, want %+v", got, want)
	}
}

func TestClickHouseSinkInsertIntoHungServerEndsWithItsContext(t *testing.T) {
	srv := chtest.Start(t)
	sink := openClickHouseSink(t, srv)
	srv.Pause()
	const bound = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	began := time.Now()
	err := sink.Insert(ctx, clickHouseTestEvents(t, 10))
	cancel()
	took := time.Since(began)
	if err == nil {
		t.Fatal("insert into a frozen server succeeded")
	}
	if took > bound+time.Second {
		t.Fatalf("insert into a frozen server returned after %v, its context ended after %v", took, bound)
	}
	srv.Resume()
	events := clickHouseTestEvents(t, 10)
	if err := sink.Insert(context.Background(), events); err != nil {
		t.Fatalf("insert after resume: %v", err)
	}
}

// BenchmarkClickHouseInsert measures the sink against a local 18.16; the
// goal is 20,000 events/s on 2 cores. Inserting the same batch each time is
// as costly for ClickHouse as fresh ids, which merging dedups later.
func BenchmarkClickHouseInsert(b *testing.B) {
	srv := chtest.Start(b)
	sink := openClickHouseSink(b, srv)
	for _, size := range []int{1000, 5000} {
		events := clickHouseTestEvents(b, size)
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				if err := sink.Insert(ctx, events); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
		})
	}
	var delayed uint64
	_ = sink.Conn().QueryRow(context.Background(), "SELECT sum(value) FROM system.events WHERE event = 'DelayedInserts'").Scan(&delayed)
	b.Logf("inserts ClickHouse delayed for too many parts: %d", delayed)
}

// A DSN option the driver does not read itself is a ClickHouse setting,
// which a ping does not send: ?sekure=true connected, and then every
// batch failed with "Unknown setting sekure" while billing retried
// forever. OpenClickHouse now says which settings ClickHouse refuses.
func TestOpenClickHouseRefusesTheDSNsUnknownSetting(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := billing.OpenClickHouse(ctx, srv.DSN()+"?sekure=true&max_threads=2")
	var settingsErr *billing.DSNSettingsError
	if !errors.As(err, &settingsErr) {
		t.Fatalf("got %v, want a DSNSettingsError", err)
	}
	// ClickHouse names the one it does not know: max_threads is not to
	// blame, and was named beside it.
	if want := []string{"sekure"}; !reflect.DeepEqual(settingsErr.Settings, want) {
		t.Errorf("settings %q, want %q", settingsErr.Settings, want)
	}
	for _, want := range []string{"Unknown setting sekure", "clickhouse.dsn"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	sink, err := billing.OpenClickHouse(ctx, srv.DSN()+"?max_threads=2")
	if err != nil {
		t.Fatalf("a setting ClickHouse knows: %v", err)
	}
	sink.Close()
}

// A user or password ClickHouse refuses ("code: 193, message: Wrong
// password for user default") was reported as ClickHouse unreachable and
// retried forever, sending the operator to the network. ClickHouse
// answered: OpenClickHouse now says it refuses the DSN's credentials,
// without printing the password.
func TestOpenClickHouseRefusesTheDSNsCredentials(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const password = "pa55-of-the-test"
	for _, user := range []string{
		"default", // the test server's: it has no password
		"nobody",
	} {
		userinfo := user + ":" + password
		dsn := strings.Replace(srv.DSN(), "clickhouse://", "clickhouse://"+userinfo+"@", 1)
		_, err := billing.OpenClickHouse(ctx, dsn)
		t.Logf("user %s: %v", user, err)
		var credentialsErr *billing.DSNCredentialsError
		if !errors.As(err, &credentialsErr) {
			t.Fatalf("user %s: got %v, want a DSNCredentialsError", user, err)
		}
		if !billing.IsDSNRefused(err) {
			t.Errorf("user %s: IsDSNRefused(%v) is false", user, err)
		}
		for _, want := range []string{"refuses the user and password of clickhouse.dsn", srv.Addr(), "user " + user} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q does not say %q", err, want)
			}
		}
		if strings.Contains(err.Error(), password) {
			t.Errorf("%q shows the password", err)
		}
	}
}
