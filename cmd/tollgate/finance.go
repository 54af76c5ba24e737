package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/billing/schema"
	"github.com/tollgate/tollgate/config"
)

// runFinance is `tollgate finance`: the finance queries of
// billing/schema/queries.sql with their placeholders filled in, run
// against clickhouse.dsn (ClickHouse 18.16 has no query parameters, so
// clickhouse-client alone would need the SQL edited by hand).
func runFinance(args []string) error {
	fs := flag.NewFlagSet("finance", flag.ContinueOnError)
	// The usage below names -sql; the flag package's own would print a
	// second, shorter one on stderr.
	fs.SetOutput(io.Discard)
	printSQL := fs.Bool("sql", false, "print the SQL with its parameters filled in instead of running it")
	pos, err := parseInterleaved(fs, args)
	// "finance help" and "finance -h" are asking for the list of queries,
	// which "finance" alone prints: they said "no finance query" and
	// "flag: help requested", and exited 1.
	wantsList := errors.Is(err, flag.ErrHelp) || err == nil && len(pos) > 0 && pos[0] == "help"
	if err != nil && !wantsList {
		return usageError{err}
	}
	if len(pos) == 0 || wantsList {
		return printFinanceUsage()
	}
	q, err := schema.FinanceQuery(pos[0])
	if err != nil {
		return usageError{err} // no such query
	}
	values := map[string]string{}
	for _, kv := range pos[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return usageErrorf("parameter %q: write name=value", kv)
		}
		// The last of two used to win: a pasted line with an old month
		// left in it ran another month's invoice without a word.
		if first, given := values[k]; given {
			return usageErrorf("%s is given twice (%q and %q): give each parameter once", k, first, v)
		}
		values[k] = v
	}
	sql, err := q.Bind(values)
	if err != nil {
		return usageError{err} // a parameter missing, unknown or invalid
	}
	if *printSQL {
		fmt.Println(sql)
		return nil
	}
	cfg, err := config.LoadNotConnecting(configPath(nil))
	if err != nil {
		return err
	}
	var envFile string
	cfg.ClickHouse.DSN, envFile = localClickHouseDSN(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sink, err := billing.OpenClickHouse(ctx, cfg.ClickHouse.DSN)
	if err != nil {
		// After Ctrl-C of make run the env file is still there, its
		// ClickHouse not: a bare "connection refused" did not say why.
		if envFile != "" && errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("ClickHouse at %s (from %s): %w; make run's ClickHouse stops when its gateway exits: "+
				"start it again with `scripts/clickhouse.sh start %s` (in the repository), or run make run again",
				config.RedactURL(cfg.ClickHouse.DSN), envFile, err, filepath.Dir(envFile))
		}
		return fmt.Errorf("ClickHouse at %s: %w", config.RedactURL(cfg.ClickHouse.DSN), err)
	}
	defer sink.Close()
	rows, err := sink.Conn().Query(ctx, strings.TrimSuffix(strings.TrimSpace(sql), ";"))
	if err != nil {
		return err
	}
	defer rows.Close()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(rows.Columns(), "\t")+"\t")
	types := rows.ColumnTypes()
	for rows.Next() {
		cells := make([]any, len(types))
		for i, ct := range types {
			cells[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(cells...); err != nil {
			return err
		}
		out := make([]string, len(cells))
		for i, c := range cells {
			out[i] = cellText(reflect.ValueOf(c).Elem().Interface(), types[i].DatabaseTypeName())
		}
		fmt.Fprintln(tw, strings.Join(out, "\t")+"\t")
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return errors.Join(tw.Flush())
}

// printFinanceUsage lists the queries of billing/schema/queries.sql with
// their parameters and docs.
func printFinanceUsage() error {
	queries, err := schema.FinanceQueries()
	if err != nil {
		return err
	}
	fmt.Println("usage: tollgate finance QUERY name=value ... [-sql]\n\n" +
		"Each parameter is given once; -sql prints the SQL with them filled in instead of running it.\n\nqueries:")
	for _, q := range queries {
		var params []string
		for _, p := range q.Params {
			params = append(params, p.Name+"="+strings.ToLower(p.Type))
		}
		fmt.Printf("\n  %s %s\n    %s\n", q.Name, strings.Join(params, " "), strings.ReplaceAll(q.Doc, "\n", "\n    "))
	}
	return nil
}

// localClickHouseDSN is the DSN to query: CLICKHOUSE_DSN or gateway.yaml's
// when either is set, else the DSN of the ClickHouse make run started
// under data_dir (its env file), which it gives only to the gateway it
// runs: on another port than 9000, finance queries found no server.
// envFile is that file's path when the DSN came from it, else "".
func localClickHouseDSN(cfg *config.Config) (dsn, envFile string) {
	if os.Getenv("CLICKHOUSE_DSN") != "" || cfg.ClickHouse.DSN != config.DefaultClickHouseDSN {
		return cfg.ClickHouse.DSN, ""
	}
	envFile = filepath.Join(cfg.Server.DataDir, "clickhouse", "env")
	data, err := os.ReadFile(envFile)
	if err != nil {
		return cfg.ClickHouse.DSN, ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if dsn, ok := strings.CutPrefix(line, "CLICKHOUSE_DSN="); ok && dsn != "" {
			return dsn, envFile
		}
	}
	return cfg.ClickHouse.DSN, ""
}

// cellText prints a cell as finance reads it: a Date as 2026-11-26, a
// DateTime in RFC 3339 (UTC), not Go's "2026-11-26 00:00:00 +0000 UTC".
// A string with a tab, a line break or another character a terminal does
// not print as itself is printed Go-quoted ("a\nb"), as is one that starts
// with a quote, so a quoted cell is never a string as it was: a logged
// body's line breaks (pretty-printed JSON, the "\n[tollgate: cut here"
// line) and tabs cut request_logs rows apart and shifted their columns.
func cellText(v any, dbType string) string {
	t, ok := v.(time.Time)
	switch {
	case !ok:
		if s, isString := v.(string); isString && needsQuoting(s) {
			return strconv.Quote(s)
		}
		return fmt.Sprint(v)
	case strings.HasPrefix(dbType, "Date") && !strings.HasPrefix(dbType, "DateTime"):
		return t.UTC().Format(time.DateOnly)
	default:
		return t.UTC().Format(time.RFC3339)
	}
}

// needsQuoting reports whether strconv.Quote would change s beyond adding
// the quotes, or s starts with a quote.
func needsQuoting(s string) bool {
	if strings.HasPrefix(s, `"`) || !utf8.ValidString(s) {
		return true
	}
	return strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) })
}
