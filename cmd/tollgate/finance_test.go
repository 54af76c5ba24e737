package main

import (
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
