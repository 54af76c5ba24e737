package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/meter"
)

// Finance prints dates as finance writes them: Go's default printed
// "2026-11-26 00:00:00 +0000 UTC" for a Date column.
func TestFinanceCellText(t *testing.T) {
	day := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v      any
		dbType string
		want   string
	}{
		{day, "Date", "2026-11-26"},
		{day.Add(90 * time.Minute), "DateTime", "2026-11-26T01:30:00Z"},
		{day.Add(90 * time.Minute), "DateTime('UTC')", "2026-11-26T01:30:00Z"},
		{uint64(42), "UInt64", "42"},
		{"acme", "String", "acme"},
		{`{"a":"b\\n"}`, "String", `{"a":"b\\n"}`},
		{"line one\nline\ttwo", "String", `"line one\nline\ttwo"`},
		{"answer\r\n[tollgate: cut here, 5 more bytes not logged]", "String", `"answer\r\n[tollgate: cut here, 5 more bytes not logged]"`},
		{`"quoted" as sent`, "String", `"\"quoted\" as sent"`},
		{"\xff\xfe", "String", `"\xff\xfe"`},
	} {
		if got := cellText(tc.v, tc.dbType); got != tc.want {
			t.Errorf("cellText(%v, %s) = %q, want %q", tc.v, tc.dbType, got, tc.want)
		}
	}
}

// TestFinanceRequestLogsKeepOneRowPerLine: a logged body with line breaks
// or tabs (pretty-printed JSON, the cut marker's own line) was printed as
// it was, so a row ran over several lines and its columns shifted.
func TestFinanceRequestLogsKeepOneRowPerLine(t *testing.T) {
	srv := chtest.Start(t)
	ctx := context.Background()
	sink, err := billing.OpenClickHouse(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	bodies := []meter.RequestLog{
		{Request: "{\n\t\"model\": \"m1\"\n}", Response: "answer\n[tollgate: cut here, 9 more bytes not logged]"},
		{Request: `{"model":"m1"}`, Response: "a\tb\r\nc"},
	}
	var events []*meter.Event
	for i, body := range bodies {
		body := body
		events = append(events, &meter.Event{
			ID: "req-" + string(rune('a'+i)), Time: time.Date(2026, 11, 26, 12, i, 0, 0, time.UTC),
			Account: "acme", KeyID: "key_logged", Endpoint: "/v1/chat/completions", Model: "m1",
			Status: 200, Log: &body,
		})
	}
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := "upstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n  - id: m1\n    context_length: 100\n    max_output_length: 10\n" +
		"clickhouse:\n  dsn: ${CLICKHOUSE_DSN}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOLLGATE_CONFIG", path)
	t.Setenv("CLICKHOUSE_DSN", srv.DSN())
	out, err := captureStdout(t, func() error {
		return runFinance([]string{"request_logs", "key_id=key_logged", "from_date=2026-11-01", "to_date=2026-12-01", "max_rows=10"})
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 1+len(bodies) {
		t.Fatalf("%d lines for a header and %d rows:\n%s", len(lines), len(bodies), out)
	}
	for _, want := range []string{`"{\n\t\"model\": \"m1\"\n}"`, `"answer\n[tollgate: cut here, 9 more bytes not logged]"`, `"a\tb\r\nc"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
}

// A parameter given twice is refused: the last one won, so a pasted
// "month=2026-11-01 month=2026-10-01" ran October's invoice silently.
func TestFinanceRefusesAParameterGivenTwice(t *testing.T) {
	err := runFinance([]string{"invoice", "account=acme", "month=2026-11-01", "month=2026-10-01", "-sql"})
	if err == nil || !strings.Contains(err.Error(), `month is given twice ("2026-11-01" and "2026-10-01")`) {
		t.Fatalf("a parameter given twice: %v", err)
	}
}

// "finance help", "-h" and "--help" print the list of queries and
// succeed, as "finance" alone does: they said `no finance query "help"`
// and "flag: help requested", and exited 1.
func TestFinanceHelpPrintsTheQueries(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"invoice", "-h"}, {}} {
		out, err := captureStdout(t, func() error { return runFinance(args) })
		if err != nil || !strings.Contains(out, "usage: tollgate finance QUERY") || !strings.Contains(out, "\n  invoice ") {
			t.Errorf("finance %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// captureStdout runs fn and returns what it printed on stdout.
func captureStdout(t *testing.T, fn func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	err = fn()
	os.Stdout = stdout
	w.Close()
	return string(<-done), err
}

// TestFinanceSaysMakeRunsClickHouseStopsWithTheGateway: after Ctrl-C of
// make run, finance found the DSN in data_dir/clickhouse/env and failed
// with a bare "connection refused": make run stops its ClickHouse when
// the gateway exits, and nothing said so or how to start it again.
func TestFinanceSaysMakeRunsClickHouseStopsWithTheGateway(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stopped := l.Addr().String() // nothing listens here once closed
	l.Close()
	data := t.TempDir()
	chDir := filepath.Join(data, "clickhouse")
	if err := os.MkdirAll(chDir, 0o700); err != nil {
		t.Fatal(err)
	}
	env := "CLICKHOUSE_DSN=clickhouse://" + stopped + "/default?dial_timeout=2s\n"
	if err := os.WriteFile(filepath.Join(chDir, "env"), []byte(env), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := "server:\n  data_dir: " + data + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n" +
		"models:\n  - id: m1\n    context_length: 100\n    max_output_length: 10\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOLLGATE_CONFIG", path)
	t.Setenv("CLICKHOUSE_DSN", "")
	err = runFinance([]string{"invoice", "account=acme", "month=2026-11-01"})
	if err == nil {
		t.Fatal("finance against a stopped ClickHouse succeeded")
	}
	for _, want := range []string{"connection refused", "stops when its gateway exits", "scripts/clickhouse.sh start " + chDir, "make run"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}

	// A DSN the user gave (CLICKHOUSE_DSN) is theirs to start: no word
	// about make run.
	t.Setenv("CLICKHOUSE_DSN", "clickhouse://"+stopped+"/default?dial_timeout=2s")
	err = runFinance([]string{"invoice", "account=acme", "month=2026-11-01"})
	if err == nil || strings.Contains(err.Error(), "make run") {
		t.Errorf("a refused CLICKHOUSE_DSN: %v", err)
	}
}
