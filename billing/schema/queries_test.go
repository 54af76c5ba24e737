package schema_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/billing/schema"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// billingEvents returns n events of two accounts on 40 days from 1 January
// 2025 (UTC), with costs that do not add up to round numbers. Events i and
// i+120 share day, account, model and endpoint, so rollups have groups of
// several events.
func billingEvents(t testing.TB, n int) []*meter.Event {
	t.Helper()
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	events := make([]*meter.Event, n)
	for i := range events {
		id, err := uuid.NewV7()
		if err != nil {
			t.Fatal(err)
		}
		events[i] = &meter.Event{
			ID:               id.String(),
			Time:             start.Add(time.Duration(i%40)*24*time.Hour + time.Duration(i)*time.Minute),
			Account:          []string{"acme", "globex"}[i%2],
			KeyID:            fmt.Sprintf("key-%d", i%5),
			Endpoint:         []string{"/v1/chat/completions", "/v1/responses"}[(i/2)%2],
			Model:            []string{"small", "vision", "reasoner"}[i%3],
			Upstream:         "local",
			PromptTokens:     int64(1000 + i),
			CachedTokens:     int64(i % 100),
			CompletionTokens: int64(50 + i%300),
			ReasoningTokens:  int64(i % 17),
			Images:           int64(i % 3 / 2),
			CostNanos:        money.Nanos(987_654_321 + int64(i)*7_777_777),
			UsageSource:      meter.SourceUpstream,
			Status:           200,
			Latency:          time.Second,
			TTFB:             100 * time.Millisecond,
		}
	}
	return events
}

func openSink(t testing.TB, srv *chtest.Server) *billing.ClickHouseSink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := billing.OpenClickHouse(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	return sink
}

// table is query output in TabSeparatedWithNames, row by row, by column name.
type table []map[string]string

func runQuery(t testing.TB, srv *chtest.Server, q schema.Query, params map[string]string) table {
	t.Helper()
	sql, err := q.Bind(params)
	if err != nil {
		t.Fatal(err)
	}
	out := srv.Query(t, sql+"\nFORMAT TabSeparatedWithNames")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	names := strings.Split(lines[0], "\t")
	var rows table
	for _, line := range lines[1:] {
		row := make(map[string]string)
		for i, v := range strings.Split(line, "\t") {
			row[names[i]] = v
		}
		rows = append(rows, row)
	}
	return rows
}

func sumColumn(t testing.TB, rows table, column string) int64 {
	t.Helper()
	var sum int64
	for _, row := range rows {
		v, err := strconv.ParseInt(row[column], 10, 64)
		if err != nil {
			t.Fatalf("column %s: %v", column, err)
		}
		sum += v
	}
	return sum
}

func TestFinanceQueriesAreExactAfterRedelivery(t *testing.T) {
	srv := chtest.Start(t)
	sink := openSink(t, srv)
	ctx := context.Background()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	events := billingEvents(t, 600)
	for i, ev := range events {
		if ev.KeyID == "key-0" { // it logs its requests
			ev.Log = &meter.RequestLog{Request: fmt.Sprintf(`{"n":%d}`, i), Response: "answer"}
		}
	}
	for range 2 { // the second insert is JetStream redelivering every event
		if err := sink.Insert(ctx, events); err != nil {
			t.Fatal(err)
		}
	}

	var total, acmeJanuary money.Nanos
	var acmeJanuaryRequests int64
	for _, ev := range events {
		total += ev.CostNanos
		if ev.Account == "acme" && ev.Time.Month() == time.January {
			acmeJanuary += ev.CostNanos
			acmeJanuaryRequests++
		}
	}
	whole := map[string]string{"from_date": "2025-01-01", "to_date": "2025-03-01"}

	queries, err := schema.FinanceQueries()
	if err != nil {
		t.Fatal(err)
	}
	ran := make(map[string]table)
	for _, q := range queries {
		params := whole
		switch q.Name {
		case "invoice":
			params = map[string]string{"account": "acme", "month": "2025-01-20"}
		case "request_logs":
			params = map[string]string{"key_id": "key-0", "from_date": "2025-01-01", "to_date": "2025-03-01", "max_rows": "1000"}
		}
		rows := runQuery(t, srv, q, params)
		if len(rows) == 0 {
			t.Errorf("%s returned no rows", q.Name)
		}
		for _, row := range rows {
			if _, ok := row["spend_nanos"]; !ok {
				continue
			}
			nanos, _ := strconv.ParseInt(row["spend_nanos"], 10, 64)
			if got, want := row["spend_usd"], money.Nanos(nanos).String(); got != want {
				t.Errorf("%s: spend_usd %s for %d nanos, want %s", q.Name, got, nanos, want)
			}
		}
		ran[q.Name] = rows
	}
	for _, name := range []string{"spend_per_account_per_day", "spend_per_account_per_month", "tokens_and_cost_per_model", "top_keys_by_spend"} {
		rows, ok := ran[name]
		if !ok {
			t.Errorf("queries.sql lost %s", name)
			continue
		}
		if got := money.Nanos(sumColumn(t, rows, "spend_nanos")); got != total {
			t.Errorf("%s: spend adds up to %v, want %v", name, got, total)
		}
		if got := sumColumn(t, rows, "requests"); got != int64(len(events)) {
			t.Errorf("%s: %d requests, want %d", name, got, len(events))
		}
	}

	// Key key-0 logged every fifth event; the second insert's copies
	// collapse like usage_events'.
	if logs := ran["request_logs"]; len(logs) != len(events)/5 {
		t.Errorf("request_logs: %d rows for key-0, want %d", len(logs), len(events)/5)
	}

	invoice := ran["invoice"]
	if len(invoice) < 2 {
		t.Fatalf("invoice has %d rows, want lines and a total", len(invoice))
	}
	lines, totalLine := invoice[:len(invoice)-1], invoice[len(invoice)-1]
	if totalLine["model"] != "TOTAL" {
		t.Fatalf("the invoice's last line is %v, want the TOTAL", totalLine)
	}
	if got := totalLine["spend_usd"]; got != acmeJanuary.String() {
		t.Errorf("invoice total %s USD, want %s", got, acmeJanuary)
	}
	if got := money.Nanos(sumColumn(t, lines, "spend_nanos")); got != acmeJanuary {
		t.Errorf("invoice lines add up to %v, want %v", got, acmeJanuary)
	}
	if got := totalLine["requests"]; got != strconv.FormatInt(acmeJanuaryRequests, 10) {
		t.Errorf("invoice total has %s requests, want %d", got, acmeJanuaryRequests)
	}
	for _, line := range lines {
		if line["model"] == "TOTAL" || line["endpoint"] == "" {
			t.Errorf("invoice line %v is not a model and endpoint", line)
		}
	}
}

// TestPerModelQueryKeepsPluginPricedCallsApart: tokens_and_cost_per_model
// grouped by model alone, so a model's classify calls, priced at
// plugins.pricing, were summed with its chat calls, priced at the model's
// prices, and the line could be checked against neither.
func TestPerModelQueryKeepsPluginPricedCallsApart(t *testing.T) {
	srv := chtest.Start(t)
	sink := openSink(t, srv)
	ctx := context.Background()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	events := billingEvents(t, 40)
	want := make(map[[2]string]money.Nanos)
	for i, ev := range events {
		ev.Model = "small"
		if i%4 == 0 {
			ev.Endpoint = []string{"/v1/classify", "/v1/batch"}[i%8/4]
		}
		want[[2]string{ev.Model, ev.Endpoint}] += ev.CostNanos
	}
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	q, err := schema.FinanceQuery("tokens_and_cost_per_model")
	if err != nil {
		t.Fatal(err)
	}
	rows := runQuery(t, srv, q, map[string]string{"from_date": "2025-01-01", "to_date": "2025-03-01"})
	got := make(map[[2]string]money.Nanos)
	for _, row := range rows {
		nanos, _ := strconv.ParseInt(row["spend_nanos"], 10, 64)
		got[[2]string{row["model"], row["endpoint"]}] += money.Nanos(nanos)
	}
	if len(rows) != len(want) || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%d rows, spend per model and endpoint %v; want %d rows, %v", len(rows), got, len(want), want)
	}
}

func TestInvoiceParameterCannotEscapeItsQuotes(t *testing.T) {
	srv := chtest.Start(t)
	sink := openSink(t, srv)
	ctx := context.Background()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sink.Insert(ctx, billingEvents(t, 20)); err != nil {
		t.Fatal(err)
	}
	q, err := schema.FinanceQuery("invoice")
	if err != nil {
		t.Fatal(err)
	}
	for _, account := range []string{`acme' OR account != '`, `acme\' OR 1 = 1 OR account = \'`} {
		rows := runQuery(t, srv, q, map[string]string{"account": account, "month": "2025-01-01"})
		if len(rows) != 1 || rows[0]["requests"] != "0" {
			t.Errorf("account %q: got %v, want only an empty TOTAL", account, rows)
		}
	}
}

func TestDailyRollupCountsEventsInsertedBeforeItAndRedeliveredOnce(t *testing.T) {
	srv := chtest.Start(t)
	sink := openSink(t, srv)
	ctx := context.Background()
	migrations, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// Only usage_events exists while the first events come in.
	for _, statement := range migrations[0].Statements {
		if err := sink.Conn().Exec(ctx, statement); err != nil {
			t.Fatal(err)
		}
	}
	events := billingEvents(t, 300)
	early, late := events[:200], events[200:]
	if err := sink.Insert(ctx, early); err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Redelivery of a batch that straddles the view's creation.
	for _, batch := range [][]*meter.Event{late, events[150:], late} {
		if err := sink.Insert(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}

	want := make(map[string]int64)
	for _, ev := range events {
		key := strings.Join([]string{ev.Time.UTC().Format(time.DateOnly), ev.Account, ev.Model, ev.Endpoint}, "\t")
		want[key] += int64(ev.CostNanos)
	}
	out := srv.Query(t, "SELECT date, account, model, endpoint, cost_nanos FROM usage_daily")
	got := make(map[string]int64)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		cut := strings.LastIndexByte(line, '\t')
		cost, err := strconv.ParseInt(line[cut+1:], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		got[line[:cut]] = cost
	}
	if len(got) != len(want) {
		t.Fatalf("rollup has %d rows, want %d", len(got), len(want))
	}
	for key, cost := range want {
		if got[key] != cost {
			t.Errorf("rollup %q: cost %d, want %d", key, got[key], cost)
		}
	}
}

func TestBind(t *testing.T) {
	q, err := schema.FinanceQuery("invoice")
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Params) != 2 || q.Params[0] != (schema.Param{Name: "account", Type: "String"}) ||
		q.Params[1] != (schema.Param{Name: "month", Type: "Date"}) {
		t.Fatalf("invoice params %v, want account String and month Date", q.Params)
	}
	if !strings.Contains(q.Doc, "invoice") {
		t.Errorf("invoice doc %q does not say what it answers", q.Doc)
	}

	sql, err := q.Bind(map[string]string{"account": `o'brien\`, "month": "2025-02-01"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sql, `account = 'o\'brien\\'`) || !strings.Contains(sql, "toStartOfMonth(toDate('2025-02-01'))") {
		t.Errorf("bound SQL lacks the literals:\n%s", sql)
	}
	if strings.Contains(sql, "{") {
		t.Errorf("a placeholder is left:\n%s", sql)
	}

	for name, params := range map[string]map[string]string{
		"missing month":  {"account": "acme"},
		"unknown param":  {"account": "acme", "month": "2025-02-01", "monht": "2025-02-01"},
		"month not date": {"account": "acme", "month": "2025-02"},
		"date injection": {"account": "acme", "month": "2025-02-01') OR (1"},
		// ClickHouse moves these to another month, or to 0000-00-00.
		"no 31st of November": {"account": "acme", "month": "2026-11-31"},
		"no 13th month":       {"account": "acme", "month": "2026-13-01"},
	} {
		if _, err := q.Bind(params); err == nil {
			t.Errorf("%s: bound without error", name)
		}
	}
	// Integers are checked against their type's range.
	logs, err := schema.FinanceQuery("request_logs")
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"key_id": "key_1", "from_date": "2026-11-01", "to_date": "2026-12-01"}
	for rows, ok := range map[string]bool{"50": true, "0": true, "4294967295": true, "-1": false, "4294967296": false} {
		params := map[string]string{"max_rows": rows}
		for k, v := range base {
			params[k] = v
		}
		if _, err := logs.Bind(params); (err == nil) != ok {
			t.Errorf("max_rows=%s: %v", rows, err)
		}
	}
	if _, err := schema.FinanceQuery("nope"); err == nil || !strings.Contains(err.Error(), "invoice") {
		t.Errorf("unknown query: %v, want an error listing the queries", err)
	}
}

// TestDatesBeyondClickHouseDateRange: ClickHouse 18.16 reads a Date after
// 2105-12-31 or before 1970-01-01 as 0000-00-00, so to_date=9999-12-31
// (finance's "to the end") printed only the header, and an invoice for
// month=2106-01-01 billed January 1970. An open end now reaches the last
// day, and a day no query can mean is refused.
func TestDatesBeyondClickHouseDateRange(t *testing.T) {
	srv := chtest.Start(t)
	sink := openSink(t, srv)
	ctx := context.Background()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	events := billingEvents(t, 20)
	// The first and the last days a Date holds.
	events[0].Time = time.Date(1970, 1, 1, 0, 0, 1, 0, time.UTC)
	events[1].Time = time.Date(2105, 12, 31, 23, 0, 0, 0, time.UTC)
	for _, ev := range events {
		ev.KeyID = "key-0"
		ev.Log = &meter.RequestLog{Request: "{}", Response: "answer"}
	}
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	query := func(name string) schema.Query {
		q, err := schema.FinanceQuery(name)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	everything := map[string]string{"from_date": "1900-01-01", "to_date": "9999-12-31"}
	if got := sumColumn(t, runQuery(t, srv, query("top_keys_by_spend"), everything), "requests"); got != int64(len(events)) {
		t.Errorf("top_keys_by_spend from 1900-01-01 to 9999-12-31: %d requests, want %d", got, len(events))
	}
	logs := runQuery(t, srv, query("request_logs"), map[string]string{"key_id": "key-0", "from_date": "2025-01-01", "to_date": "9999-12-31", "max_rows": "1000"})
	if len(logs) != len(events)-1 {
		t.Errorf("request_logs from 2025-01-01 to 9999-12-31: %d rows, want %d", len(logs), len(events)-1)
	}
	invoice := runQuery(t, srv, query("invoice"), map[string]string{"account": events[1].Account, "month": "2105-12-15"})
	if total := invoice[len(invoice)-1]; total["model"] != "TOTAL" || total["requests"] != "1" {
		t.Errorf("invoice of December 2105: %v, want the one event of that month", invoice)
	}

	for name, params := range map[string]map[string]string{
		"invoice after 2105":   {"account": "acme", "month": "2106-01-01"},
		"invoice before 1970":  {"account": "acme", "month": "1969-12-01"},
		"range starting after": {"from_date": "2106-01-01", "to_date": "9999-12-31"},
		"range ending before":  {"from_date": "1900-01-01", "to_date": "1969-12-31"},
	} {
		q := query("invoice")
		if _, ok := params["from_date"]; ok {
			q = query("top_keys_by_spend")
		}
		_, err := q.Bind(params)
		if err == nil || !strings.Contains(err.Error(), "1970-01-01..2105-12-31") {
			t.Errorf("%s: %v, want an error naming the days a Date holds", name, err)
		}
	}
}

// TestInvoiceCountsABatchJobOnce: a job bills one row per stop and one
// when it completes, all with its job_id, and the invoice said
// "/v1/batch requests 3" for one job that stopped twice.
func TestInvoiceCountsABatchJobOnce(t *testing.T) {
	srv := chtest.Start(t)
	sink := openSink(t, srv)
	ctx := context.Background()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	events := billingEvents(t, 20)
	var calls int64
	for _, ev := range events {
		ev.Account, ev.Time = "acme", time.Date(2025, 1, 10, 12, 0, 0, 0, time.UTC)
		calls++
	}
	// Two jobs: one that stopped twice, on other days, and one that did not.
	job := func(id string, bills int) {
		for i := range bills {
			ev := *events[0]
			ev.ID, ev.JobID, ev.Endpoint, ev.Model = id, id, "/v1/batch", "lexical"
			if i < bills-1 {
				ev.ID = fmt.Sprintf("%s.%d", id, i+1)
			}
			ev.Time = time.Date(2025, 1, 3+i, 0, 0, 0, 0, time.UTC)
			events = append(events, &ev)
		}
	}
	job(uuid.NewString(), 3)
	job(uuid.NewString(), 1)
	for range 2 { // the second insert is JetStream redelivering every event
		if err := sink.Insert(ctx, events); err != nil {
			t.Fatal(err)
		}
	}
	q, err := schema.FinanceQuery("invoice")
	if err != nil {
		t.Fatal(err)
	}
	rows := runQuery(t, srv, q, map[string]string{"account": "acme", "month": "2025-01-01"})
	var batchRequests, totalRequests string
	for _, row := range rows {
		switch {
		case row["endpoint"] == "/v1/batch":
			batchRequests = row["requests"]
		case row["model"] == "TOTAL":
			totalRequests = row["requests"]
		}
	}
	if batchRequests != "2" || totalRequests != strconv.FormatInt(calls+2, 10) {
		t.Fatalf("invoice %v: /v1/batch requests %s, total %s; want 2 jobs, and %d calls and 2 jobs", rows, batchRequests, totalRequests, calls)
	}
}

// request_logs with max_rows gives the newest calls, also of one second:
// time is whole seconds, and calls of the same second came out oldest
// first, so max_rows=2 of four such calls gave the first two.
func TestRequestLogsNewestFirstWithinASecond(t *testing.T) {
	srv := chtest.Start(t)
	sink := openSink(t, srv)
	ctx := context.Background()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	events := billingEvents(t, 4)
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, ev := range events {
		ev.KeyID = "key-0"
		ev.Time = at.Add(time.Duration(i) * 100 * time.Millisecond) // one second, ids in the calls' order (UUIDv7)
		ev.Log = &meter.RequestLog{Request: fmt.Sprintf(`{"n":%d}`, i), Response: "answer"}
	}
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	q, err := schema.FinanceQuery("request_logs")
	if err != nil {
		t.Fatal(err)
	}
	logs := runQuery(t, srv, q, map[string]string{"key_id": "key-0", "from_date": "2025-01-01", "to_date": "2025-02-01", "max_rows": "2"})
	if len(logs) != 2 || logs[0]["id"] != events[3].ID || logs[1]["id"] != events[2].ID {
		t.Fatalf("request_logs max_rows=2: %v; want the last two calls, %s then %s", logs, events[3].ID, events[2].ID)
	}
}
