package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"
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
	} {
		if got := cellText(tc.v, tc.dbType); got != tc.want {
			t.Errorf("cellText(%v, %s) = %q, want %q", tc.v, tc.dbType, got, tc.want)
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
