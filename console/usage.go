package console

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/money"
)

// UsageDays is how many UTC days, today included, the overview shows.
const UsageDays = 30

// UsageMonths is how many calendar months (UTC) of totals the console
// shows, this one included.
const UsageMonths = 12

const (
	usageQueryTimeout = 5 * time.Second
	usageDialTimeout  = 2 * time.Second
	// usageRetryAfter keeps a down ClickHouse from costing every page load
	// a dial timeout.
	usageRetryAfter = 5 * time.Second
)

// usageReader reads an account's usage from ClickHouse, connecting on first
// use. A ClickHouse that is missing or down only makes usage unavailable.
type usageReader struct {
	dsn  string
	logf func(string, ...any)

	mu       sync.Mutex
	conn     driver.Conn             // given, or opened from dsn
	sink     *billing.ClickHouseSink // opened here, closed by close
	failedAt time.Time
	lastErr  error
	// settingsErr: ClickHouse refuses clickhouse.dsn's settings
	// (billing.DSNSettingsError). Trying again does not help: usage is
	// unavailable until a restart brings another DSN (it is not
	// reloadable).
	settingsErr error
	// slowUntil: a query failed, in its handshake or its answer (timed
	// out, refused); until then pages show usage unavailable at once
	// instead of each waiting for a deadline or the pool dialling again.
	slowUntil time.Time
}

// usageRow is one (day, model) of an account's usage.
type usageRow struct {
	Day        string // YYYY-MM-DD, UTC
	Model      string
	Endpoint   string // /v1/chat/completions, /v1/classify, …
	Requests   uint64
	Prompt     int64
	Cached     int64 // of Prompt, read from the upstream's cache
	Completion int64
	Estimated  uint64 // requests billed on usage the gateway counted
	Cost       money.Nanos
}

func (u *usageReader) connect(ctx context.Context) (driver.Conn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != nil {
		return u.conn, nil
	}
	if u.dsn == "" {
		return nil, errors.New("no clickhouse.dsn configured")
	}
	if u.settingsErr != nil {
		return nil, u.settingsErr
	}
	if !u.failedAt.IsZero() && time.Since(u.failedAt) < usageRetryAfter {
		return nil, u.lastErr
	}
	ctx, cancel := context.WithTimeout(ctx, usageDialTimeout)
	defer cancel()
	sink, err := billing.OpenClickHouse(ctx, withDialTimeout(u.dsn))
	if err != nil {
		if billing.IsDSNSettings(err) {
			u.settingsErr = err
			u.logf("console: usage unavailable until clickhouse.dsn is corrected and serve restarted: %v", err)
			return nil, err
		}
		u.failedAt, u.lastErr = time.Now(), err
		u.logf("console: usage unavailable (retrying in %s): %v", usageRetryAfter, err)
		return nil, err
	}
	u.sink, u.conn = sink, sink.Conn()
	return u.conn, nil
}

// withDialTimeout shortens the connect timeout unless the DSN sets one: a
// page waits for it.
func withDialTimeout(dsn string) string {
	parsed, err := url.Parse(dsn)
	if err != nil || parsed.Query().Has("dial_timeout") {
		return dsn
	}
	q := parsed.Query()
	q.Set("dial_timeout", usageDialTimeout.String())
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

func (u *usageReader) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sink != nil {
		_ = u.sink.Close()
		u.sink, u.conn = nil, nil
	}
}

// usageSince returns the account's usage per UTC day, model and endpoint
// from the day of from on, in no order (summarize orders it). It reads
// FINAL, so an event the billing consumer inserted twice counts once.
func (u *usageReader) usageSince(ctx context.Context, account string, from time.Time) ([]usageRow, error) {
	return u.usage(ctx, account, from, false)
}

// monthsSince is usageSince per UTC calendar month (Day is the month's
// first day; Model and Endpoint are empty), from the month of from on:
// the totals `tollgate finance invoice` gives the operator.
func (u *usageReader) monthsSince(ctx context.Context, account string, from time.Time) ([]usageRow, error) {
	return u.usage(ctx, account, from, true)
}

// usage runs the usage query for account from the day of from on, per
// day, model and endpoint, or with perMonth per calendar month.
func (u *usageReader) usage(ctx context.Context, account string, from time.Time, perMonth bool) ([]usageRow, error) {
	u.mu.Lock()
	slow, lastErr := time.Now().Before(u.slowUntil), u.lastErr
	u.mu.Unlock()
	if slow {
		return nil, lastErr
	}
	conn, err := u.connect(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, usageQueryTimeout)
	defer cancel()
	keys, group := "toString(date) AS day, model, endpoint", "date, model, endpoint"
	if perMonth {
		keys, group = "toString(toStartOfMonth(date)) AS day, '' AS m, '' AS e", "day"
	}
	// Literals, not parameters: ClickHouse 18.16 has no query parameters.
	// The account id is validated (letters, digits, _ - .) and quoted.
	// A batch job is one request however many rows it billed (its stops'
	// and its completion's), as on the invoice these totals equal.
	query := `SELECT ` + keys + `, countIf(job_id = '') + uniqExactIf(job_id, job_id != '') AS requests,
       sum(prompt_tokens) AS prompt, sum(cached_tokens) AS cached, sum(completion_tokens) AS completion,
       countIf(usage_source = 'estimated') AS estimated, sum(cost_nanos) AS spend_nanos
FROM usage_events FINAL
WHERE account = ` + quoteString(account) + ` AND date >= toDate('` + from.UTC().Format(time.DateOnly) + `')
GROUP BY ` + group
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, u.failed(fmt.Errorf("querying usage of %s: %w", account, err))
	}
	defer rows.Close()
	var out []usageRow
	for rows.Next() {
		var r usageRow
		var cost int64
		if err := rows.Scan(&r.Day, &r.Model, &r.Endpoint, &r.Requests, &r.Prompt, &r.Cached, &r.Completion, &r.Estimated, &cost); err != nil {
			return nil, fmt.Errorf("reading usage of %s: %w", account, err)
		}
		r.Cost = money.Nanos(cost)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, u.failed(fmt.Errorf("reading usage of %s: %w", account, err))
	}
	return out, nil
}

// failed logs a query that failed and returns its err; usage is not asked
// again for usageRetryAfter. One that timed out (a ClickHouse that hangs
// rather than refuses) would cost each page its deadline; one refused (a
// ClickHouse stopped after the pool connected) cost each page a dial and
// a log line, as only timeouts were held off.
func (u *usageReader) failed(err error) error {
	u.mu.Lock()
	u.slowUntil, u.lastErr = time.Now().Add(usageRetryAfter), err
	u.mu.Unlock()
	if timedOut(err) {
		u.logf("console: usage unavailable (ClickHouse did not answer in time; not asked again for %s): %v", usageRetryAfter, err)
	} else {
		u.logf("console: usage unavailable (not asked again for %s): %v", usageRetryAfter, err)
	}
	return err
}

// timedOut reports whether err is a deadline that passed: the query's
// context, or the driver's own handshake and read deadlines, which it
// reports as net timeouts ("i/o timeout"), not as
// context.DeadlineExceeded. Counting only the latter, a hung ClickHouse
// cost every page its handshake or query deadline. Both, and
// os.ErrDeadlineExceeded, are net.Errors whose Timeout is true.
func timedOut(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

func quoteString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// usageTotals is one line of a usage table.
type usageTotals struct {
	Label      string
	Requests   uint64
	Prompt     int64
	Cached     int64
	Completion int64
	Estimated  uint64
	Cost       money.Nanos
}

func (t *usageTotals) add(r usageRow) {
	t.Requests += r.Requests
	t.Prompt += r.Prompt
	t.Cached += r.Cached
	t.Completion += r.Completion
	t.Estimated += r.Estimated
	t.Cost += r.Cost
}

// modelLabel names a per-model line. Plugin calls (classify, tag, score,
// match) are billed at the plugin price and batch jobs at the batch price
// (the tokens of a model that answered at the higher of that and the
// model's prices), so they get a line of their own: folded into the
// model's line, its cost could not be checked against the model's prices.
func modelLabel(r usageRow) string {
	label := r.Model
	if label == "" {
		label = "(no model)"
	}
	switch kind := strings.TrimPrefix(r.Endpoint, "/v1/"); kind {
	case "chat/completions", "responses", "completions", "":
		return label
	default:
		return label + " (" + kind + ")"
	}
}

// summarize folds (day, model) rows into per-day lines (newest first),
// per-model lines (biggest cost first) and the total. Sums are integers:
// the total cost is exact to the nano-dollar.
func summarize(rows []usageRow) (days, models []usageTotals, total usageTotals) {
	dayIndex := map[string]int{}
	modelIndex := map[string]int{}
	total.Label = "Total"
	for _, r := range rows {
		i, ok := dayIndex[r.Day]
		if !ok {
			i = len(days)
			dayIndex[r.Day] = i
			days = append(days, usageTotals{Label: r.Day})
		}
		days[i].add(r)
		label := modelLabel(r)
		j, ok := modelIndex[label]
		if !ok {
			j = len(models)
			modelIndex[label] = j
			models = append(models, usageTotals{Label: label})
		}
		models[j].add(r)
		total.add(r)
	}
	sort.SliceStable(days, func(a, b int) bool { return days[a].Label > days[b].Label })
	sort.SliceStable(models, func(a, b int) bool {
		if models[a].Cost != models[b].Cost {
			return models[a].Cost > models[b].Cost
		}
		return models[a].Label < models[b].Label
	})
	return days, models, total
}
