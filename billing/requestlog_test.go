package billing_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/meter"
)

// Logged calls land in request_logs with their exact text; calls of keys
// without logging leave nothing there; retention drops whole expired days.
func TestRequestLogsAndRetention(t *testing.T) {
	ch := chtest.Start(t)
	ctx := t.Context()
	sink, err := billing.OpenClickHouse(ctx, ch.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	ev := func(id string, age time.Duration, log *meter.RequestLog) *meter.Event {
		return &meter.Event{ID: id, Time: now.Add(-age), Account: "acme", KeyID: "key_1", Endpoint: "/v1/chat/completions",
			Model: "m", UsageSource: meter.SourceUpstream, Status: 200, Log: log}
	}
	req := `{"model":"m","messages":[{"role":"user","content":"tab\there, quote \" and ünïcode"}]}`
	events := []*meter.Event{
		ev("fresh", time.Hour, &meter.RequestLog{Request: req, Response: "tok0 tok1", RetentionDays: 30}),
		ev("old", 40*24*time.Hour, &meter.RequestLog{Request: "{}", Response: "x", RetentionDays: 30}),
		ev("forever", 400*24*time.Hour, &meter.RequestLog{Request: "{}", Response: "y"}),
		ev("not-logged", time.Hour, nil),
	}
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	if err := sink.Insert(ctx, events); err != nil { // a redelivery
		t.Fatal(err)
	}
	if got := ch.Query(t, "SELECT id FROM request_logs FINAL ORDER BY id"); got != "forever\nfresh\nold\n" {
		t.Fatalf("rows %q", got)
	}
	if got := ch.Query(t, "SELECT request, response FROM request_logs FINAL WHERE id = 'fresh' FORMAT JSONEachRow"); !strings.Contains(got, `"response":"tok0 tok1"`) ||
		!strings.Contains(got, `ünïcode`) || !strings.Contains(got, `\"`) {
		t.Fatalf("text not exact: %s", got)
	}
	n, err := sink.PurgeExpiredLogs(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("dropped %d partitions, want 1 (the 40-day-old row's)", n)
	}
	if got := ch.Query(t, "SELECT id FROM request_logs FINAL ORDER BY id"); got != "forever\nfresh\n" {
		t.Fatalf("after purge %q", got)
	}
	if got := ch.Query(t, "SELECT count() FROM usage_events FINAL"); got != "4\n" {
		t.Fatalf("usage rows %q: retention must not touch billing", got)
	}
}

// TestRequestLogKeptThroughTheDayRetentionDaysAfterTheCall pins what the
// README says of retention: a call's row is kept through the UTC day N
// days after the call's UTC day and goes at the first purge after that day
// ends, so it lives between N and N+1 days (the README said "N days").
func TestRequestLogKeptThroughTheDayRetentionDaysAfterTheCall(t *testing.T) {
	ch := chtest.Start(t)
	ctx := t.Context()
	sink, err := billing.OpenClickHouse(ctx, ch.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	call := time.Date(2026, 11, 1, 0, 10, 0, 0, time.UTC)
	if err := sink.Insert(ctx, []*meter.Event{{ID: "a", Time: call, Account: "acme", KeyID: "key_1",
		Endpoint: "/v1/chat/completions", Model: "m", Status: 200,
		Log: &meter.RequestLog{Request: "{}", Response: "x", RetentionDays: 30}}}); err != nil {
		t.Fatal(err)
	}
	lastDay := time.Date(2026, 12, 1, 23, 59, 59, 0, time.UTC)
	for _, purge := range []struct {
		at   time.Time
		want string
	}{{lastDay, "1\n"}, {lastDay.Add(time.Second), "0\n"}} {
		if _, err := sink.PurgeExpiredLogs(ctx, purge.at); err != nil {
			t.Fatal(err)
		}
		if got := ch.Query(t, "SELECT count() FROM request_logs FINAL"); got != purge.want {
			t.Errorf("purged at %v: %q rows of a 30-day log written %v, want %q", purge.at, got, call, purge.want)
		}
	}
}
