package billing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"github.com/tollgate/tollgate/billing/schema"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
)

// ErrClickHouseNotNative is returned for a DSN of ClickHouse's HTTP
// interface; see config.ErrClickHouseNotNative.
var ErrClickHouseNotNative = config.ErrClickHouseNotNative

// ErrInvalidEvent is returned by Insert for an event ClickHouse cannot hold
// exactly; no event of the batch is written. Inserting it again fails
// again: fix or drop the event (for a JetStream message: Term it).
var ErrInvalidEvent = errors.New("invalid usage event")

// defaultClickHouseDialTimeout bounds connecting when the DSN does not say
// (dial_timeout=…): the driver's own default of 30s would hold a billing
// batch that long when ClickHouse is down.
const defaultClickHouseDialTimeout = 5 * time.Second

// insertUsageEvents names every column: clickhouse-go needs that to insert
// into ClickHouse 18.16. date and inserted_at take their defaults, so date
// is derived by the same expression on every insert of an event. The order
// is that of the column slices in Insert.
const insertUsageEvents = `INSERT INTO usage_events (id, time, account, key_id, endpoint, model, upstream,
prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, images, cost_nanos,
usage_source, status, latency_us, ttfb_us, stream, job_id)`

// ClickHouseSink writes usage events into ClickHouse's usage_events table.
// It is safe for concurrent use.
type ClickHouseSink struct {
	conn driver.Conn
}

// OpenClickHouse connects to the ClickHouse at dsn (clickhouse://user:pass@host:port/db?options)
// and pings it.
func OpenClickHouse(ctx context.Context, dsn string) (*ClickHouseSink, error) {
	// config check refuses by the same rule, so serve never starts with
	// a DSN billing would refuse.
	opts, err := config.ParseClickHouseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing clickhouse dsn: %w", err)
	}
	if u, err := url.Parse(dsn); err == nil && !u.Query().Has("dial_timeout") {
		opts.DialTimeout = defaultClickHouseDialTimeout
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("opening clickhouse: %w", err)
	}
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		if refusesCredentials(err) {
			return nil, &DSNCredentialsError{DSN: config.RedactURL(dsn), Err: err}
		}
		return nil, fmt.Errorf("pinging clickhouse at %v: %w", opts.Addr, err)
	}
	if err := checkDSNSettings(ctx, conn, opts); err != nil {
		conn.Close()
		return nil, err
	}
	return &ClickHouseSink{conn: conn}, nil
}

// DSNSettingsError is returned by OpenClickHouse when ClickHouse refuses
// the settings clickhouse.dsn carries: an option the driver does not read
// itself (?sekure=true) goes to the server as a setting with every query,
// and a ping does not send them, so billing once connected and then
// failed every batch with "Unknown setting sekure" while retrying
// forever. Trying again does not help: correct the name or value in
// clickhouse.dsn, or remove it.
type DSNSettingsError struct {
	// Settings are the names of the DSN's server settings, sorted; only
	// the one ClickHouse says it does not know, when it says so.
	Settings []string
	Err      error
}

func (e *DSNSettingsError) Error() string {
	return fmt.Sprintf("ClickHouse refuses the server settings of clickhouse.dsn (%s): %v; "+
		"an option clickhouse-go does not read itself is sent to ClickHouse as a setting: correct its name or value, or remove it from the DSN",
		strings.Join(e.Settings, ", "), e.Err)
}

func (e *DSNSettingsError) Unwrap() error { return e.Err }

// IsDSNSettings reports whether err is, or wraps, a *DSNSettingsError:
// ClickHouse refuses the DSN's settings, and trying again does not help.
func IsDSNSettings(err error) bool {
	var settingsErr *DSNSettingsError
	return errors.As(err, &settingsErr)
}

// DSNCredentialsError is returned by OpenClickHouse when ClickHouse
// refuses the user or password of clickhouse.dsn: a wrong password, an
// unknown user, a password missing, an address the user may not come
// from. ClickHouse answered, yet billing said it was unreachable and
// retried forever, sending the operator to the network. Trying again
// does not help until the DSN or the user in ClickHouse is corrected.
type DSNCredentialsError struct {
	DSN string // clickhouse.dsn, its password hidden
	Err error
}

func (e *DSNCredentialsError) Error() string {
	return fmt.Sprintf("ClickHouse at %s refuses the user and password of clickhouse.dsn: %v; "+
		"correct them in clickhouse.dsn, or the user in ClickHouse", e.DSN, e.Err)
}

func (e *DSNCredentialsError) Unwrap() error { return e.Err }

// IsDSNRefused reports whether err is, or wraps, a *DSNSettingsError or a
// *DSNCredentialsError: ClickHouse answers but refuses clickhouse.dsn,
// and trying again does not help until it changes.
func IsDSNRefused(err error) bool {
	var credentialsErr *DSNCredentialsError
	return IsDSNSettings(err) || errors.As(err, &credentialsErr)
}

// ClickHouse's codes for a login it refuses. 18.16 answers
// WRONG_PASSWORD also for a password given to a user that has none;
// newer versions answer AUTHENTICATION_FAILED for most of these.
const (
	errCodeUnknownUser          = 192
	errCodeWrongPassword        = 193
	errCodeRequiredPassword     = 194
	errCodeIPAddressNotAllowed  = 195
	errCodeAuthenticationFailed = 516
)

// refusesCredentials reports whether err is ClickHouse refusing the
// login, told by its exception code: messages differ between versions.
func refusesCredentials(err error) bool {
	var exception *clickhouse.Exception
	if !errors.As(err, &exception) {
		return false
	}
	switch exception.Code {
	case errCodeUnknownUser, errCodeWrongPassword, errCodeRequiredPassword,
		errCodeIPAddressNotAllowed, errCodeAuthenticationFailed:
		return true
	}
	return false
}

// checkDSNSettings runs a query carrying the DSN's server settings, if it
// has any. When it fails and the same query without them does not, the
// settings are to blame: a *DSNSettingsError says so. Otherwise the
// error is returned as it is (ClickHouse went away meanwhile).
func checkDSNSettings(ctx context.Context, conn driver.Conn, opts *clickhouse.Options) error {
	if len(opts.Settings) == 0 {
		return nil
	}
	err := conn.Exec(ctx, "SELECT 1")
	if err == nil {
		return nil
	}
	bare := *opts
	bare.Settings = nil
	plain, openErr := clickhouse.Open(&bare)
	if openErr != nil {
		return fmt.Errorf("querying clickhouse at %v: %w", opts.Addr, err)
	}
	defer plain.Close()
	if plain.Exec(ctx, "SELECT 1") != nil {
		return fmt.Errorf("querying clickhouse at %v: %w", opts.Addr, err)
	}
	names := slices.Sorted(maps.Keys(opts.Settings))
	if name := unknownSetting(err); name != "" {
		if _, ok := opts.Settings[name]; ok {
			names = []string{name}
		}
	}
	return &DSNSettingsError{Settings: names, Err: err}
}

// errCodeUnknownSetting is ClickHouse's UNKNOWN_SETTING.
const errCodeUnknownSetting = 115

// unknownSetting is the setting ClickHouse's UNKNOWN_SETTING error names
// ("Unknown setting sekure"), or "".
func unknownSetting(err error) string {
	var exception *proto.Exception
	if !errors.As(err, &exception) || exception.Code != errCodeUnknownSetting {
		return ""
	}
	_, rest, ok := strings.Cut(exception.Message, "Unknown setting ")
	if !ok {
		return ""
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r != '_' && !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	if end < 0 {
		end = len(rest)
	}
	return rest[:end]
}

// Conn is the connection pool, for queries beyond inserting events.
func (s *ClickHouseSink) Conn() driver.Conn { return s.conn }

// Migrate brings the schema up to date; see schema.Migrate.
func (s *ClickHouseSink) Migrate(ctx context.Context) ([]string, error) {
	return schema.Migrate(ctx, s.conn)
}

// Close closes the connections.
func (s *ClickHouseSink) Close() error { return s.conn.Close() }

// Insert writes events in one INSERT. On error any part of the batch may
// have been written (the daily rollup is a second table); retry the whole
// batch: an event inserted again is one row under FINAL, in usage_events
// and in the rollup. ctx bounds the whole call, also against a ClickHouse
// that accepts connections but never answers: give it a deadline.
func (s *ClickHouseSink) Insert(ctx context.Context, events []*meter.Event) error {
	if len(events) == 0 {
		return nil
	}
	cols, err := usageColumnsOf(events)
	if err != nil {
		return err
	}
	batch, err := s.conn.PrepareBatch(ctx, insertUsageEvents)
	if err != nil {
		return fmt.Errorf("inserting %d usage events: %w", len(events), err)
	}
	for i, col := range cols.slices() {
		if err := batch.Column(i).Append(col); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("inserting %d usage events: column %d: %w", len(events), i, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("inserting %d usage events: %w", len(events), err)
	}
	// After the usage: a retry of a half-done Insert repeats both, and
	// both tables collapse the repeat on id.
	return s.insertLogs(ctx, events)
}

// usageColumns holds a batch column by column, the shape the native
// protocol sends: one slice append per column is far cheaper than one
// reflective append per value.
type usageColumns struct {
	id, account, keyID, endpoint, model, upstream, usageSource, jobID []string
	time                                                              []time.Time
	prompt, cached, completion, reasoning, images, cost               []int64
	status                                                            []uint16
	latencyUS, ttfbUS                                                 []uint64
	stream                                                            []uint8
}

// slices returns the columns in the order of insertUsageEvents.
func (c *usageColumns) slices() []any {
	return []any{c.id, c.time, c.account, c.keyID, c.endpoint, c.model, c.upstream,
		c.prompt, c.cached, c.completion, c.reasoning, c.images, c.cost,
		c.usageSource, c.status, c.latencyUS, c.ttfbUS, c.stream, c.jobID}
}

// DateTime holds whole seconds from 1970 to 2105 as an unsigned 32-bit count.
var (
	minDateTime = time.Unix(0, 0)
	maxDateTime = time.Unix(1<<32-1, 0)
)

func usageColumnsOf(events []*meter.Event) (*usageColumns, error) {
	n := len(events)
	c := &usageColumns{
		id: make([]string, n), account: make([]string, n), keyID: make([]string, n),
		endpoint: make([]string, n), model: make([]string, n), upstream: make([]string, n),
		usageSource: make([]string, n), jobID: make([]string, n),
		time:   make([]time.Time, n),
		prompt: make([]int64, n), cached: make([]int64, n), completion: make([]int64, n),
		reasoning: make([]int64, n), images: make([]int64, n), cost: make([]int64, n),
		status:    make([]uint16, n),
		latencyUS: make([]uint64, n), ttfbUS: make([]uint64, n),
		stream: make([]uint8, n),
	}
	for i, ev := range events {
		switch {
		case ev == nil:
			return nil, fmt.Errorf("%w: event %d of the batch is nil", ErrInvalidEvent, i)
		case ev.ID == "":
			return nil, fmt.Errorf("%w: event %d of the batch has no id, the dedup key", ErrInvalidEvent, i)
		case ev.Time.Before(minDateTime) || ev.Time.After(maxDateTime):
			return nil, fmt.Errorf("%w: event %s: time %v is outside ClickHouse DateTime", ErrInvalidEvent, ev.ID, ev.Time)
		case ev.Status < 0 || ev.Status > 0xffff:
			return nil, fmt.Errorf("%w: event %s: status %d", ErrInvalidEvent, ev.ID, ev.Status)
		}
		c.id[i] = ev.ID
		c.time[i] = ev.Time
		c.account[i] = ev.Account
		c.keyID[i] = ev.KeyID
		c.endpoint[i] = ev.Endpoint
		c.model[i] = ev.Model
		c.upstream[i] = ev.Upstream
		c.prompt[i] = ev.PromptTokens
		c.cached[i] = ev.CachedTokens
		c.completion[i] = ev.CompletionTokens
		c.reasoning[i] = ev.ReasoningTokens
		c.images[i] = ev.Images
		c.cost[i] = int64(ev.CostNanos)
		c.usageSource[i] = string(ev.UsageSource)
		c.status[i] = uint16(ev.Status)
		c.latencyUS[i] = microseconds(ev.Latency)
		c.ttfbUS[i] = microseconds(ev.TTFB)
		if ev.Stream {
			c.stream[i] = 1
		}
		c.jobID[i] = ev.JobID
	}
	return c, nil
}

func microseconds(d time.Duration) uint64 {
	if d < 0 {
		return 0
	}
	return uint64(d / time.Microsecond)
}

const insertRequestLogs = `INSERT INTO request_logs (id, time, expire_date, account, key_id, endpoint, model, stream, status, request, response)`

// keepForever is the expiry of rows whose key keeps logs without a
// retention window: the last day a ClickHouse Date holds.
var keepForever = time.Date(2105, 12, 31, 0, 0, 0, 0, time.UTC)

// expiryOf is the day a logged row stops being kept: retention days after
// the call's UTC day.
func expiryOf(ev *meter.Event) time.Time {
	if ev.Log.RetentionDays <= 0 {
		return keepForever
	}
	d := ev.Time.UTC().Truncate(24*time.Hour).AddDate(0, 0, ev.Log.RetentionDays)
	if d.After(keepForever) {
		return keepForever
	}
	return d
}

// insertLogs writes the request logs carried by events, if any.
func (s *ClickHouseSink) insertLogs(ctx context.Context, events []*meter.Event) error {
	var batch driver.Batch
	n := 0
	for _, ev := range events {
		if ev.Log == nil {
			continue
		}
		if batch == nil {
			var err error
			if batch, err = s.conn.PrepareBatch(ctx, insertRequestLogs); err != nil {
				return fmt.Errorf("inserting request logs: %w", err)
			}
		}
		stream := uint8(0)
		if ev.Stream {
			stream = 1
		}
		if err := batch.Append(ev.ID, ev.Time.UTC(), expiryOf(ev), ev.Account, ev.KeyID, ev.Endpoint, ev.Model,
			stream, uint16(ev.Status), ev.Log.Request, ev.Log.Response); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("inserting request logs: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("inserting %d request logs: %w", n, err)
	}
	return nil
}

// PurgeExpiredLogs drops the request_logs partitions whose expiry day is
// before today (UTC) and returns how many it dropped. It is how retention
// windows are enforced on ClickHouse versions without TTL.
func (s *ClickHouseSink) PurgeExpiredLogs(ctx context.Context, now time.Time) (int, error) {
	today := now.UTC().Format("20060102")
	rows, err := s.conn.Query(ctx, `SELECT DISTINCT partition FROM system.parts
		WHERE database = currentDatabase() AND table = 'request_logs' AND active`)
	if err != nil {
		return 0, fmt.Errorf("listing request_logs partitions: %w", err)
	}
	var expired []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return 0, err
		}
		// Partition ids are YYYYMMDD numbers, so string order is day order.
		if len(p) == 8 && p < today {
			expired = append(expired, p)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, p := range expired {
		if err := s.conn.Exec(ctx, "ALTER TABLE request_logs DROP PARTITION "+p); err != nil {
			return 0, fmt.Errorf("dropping expired request_logs partition %s: %w", p, err)
		}
	}
	return len(expired), nil
}
