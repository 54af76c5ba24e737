package console

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/meter"
)

// hangingConn is a ClickHouse that accepted the connection and then
// stopped answering (SIGSTOP, a full disk): every query waits for its
// context.
type hangingConn struct {
	driver.Conn
	queries atomic.Int32
}

func (h *hangingConn) Query(ctx context.Context, _ string, _ ...any) (driver.Rows, error) {
	h.queries.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// A ClickHouse that hangs cost every console page the whole query timeout;
// after one timeout the pages say "usage unavailable" at once for a while.
func TestUsageBacksOffAClickHouseThatHangs(t *testing.T) {
	hc := &hangingConn{}
	u := &usageReader{conn: hc, logf: t.Logf}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := u.usageSince(ctx, "acme", time.Now()); err == nil {
		t.Fatal("a hanging query returned no error")
	}
	start := time.Now()
	if _, err := u.usageSince(t.Context(), "acme", time.Now()); err == nil {
		t.Fatal("the second page got usage from a hanging ClickHouse")
	}
	if waited := time.Since(start); waited > time.Second {
		t.Fatalf("the second page waited %s", waited)
	}
	if n := hc.queries.Load(); n != 1 {
		t.Fatalf("%d queries sent to a hanging ClickHouse, want 1", n)
	}
}

// silentServer is a ClickHouse that was stopped (SIGSTOP) with its port
// open: the kernel accepts connections, nothing ever answers. It counts
// the connections.
func silentServer(t *testing.T) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = &atomic.Int32{}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), accepted
}

// A hung ClickHouse made every overview wait: the driver reports its
// handshake and read deadlines as net timeouts ("i/o timeout"), not as
// context.DeadlineExceeded, so the backoff never began, and the pool
// dialled again on each page. A timeout of any kind now backs off.
func TestUsageBacksOffAClickHouseWhoseHandshakeTimesOut(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reader func(addr string) *usageReader
	}{
		// The pool, once connected, dials again for a query.
		{"pool", func(addr string) *usageReader {
			conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			return &usageReader{conn: conn, logf: t.Logf}
		}},
		// The first connection, from clickhouse.dsn.
		{"dsn", func(addr string) *usageReader {
			return &usageReader{dsn: "clickhouse://" + addr + "?dial_timeout=200ms", logf: t.Logf}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, accepted := silentServer(t)
			u := tc.reader(addr)
			defer u.close()
			_, err := u.usageSince(t.Context(), "acme", time.Now())
			if err == nil {
				t.Fatal("a silent ClickHouse returned usage")
			}
			t.Logf("first page: %v", err)
			for range 3 {
				start := time.Now()
				if _, err := u.usageSince(t.Context(), "acme", time.Now()); err == nil {
					t.Fatal("a later page got usage from a silent ClickHouse")
				}
				if waited := time.Since(start); waited > 100*time.Millisecond {
					t.Fatalf("a later page waited %s", waited)
				}
			}
			if n := accepted.Load(); n != 1 {
				t.Fatalf("%d connections to a silent ClickHouse, want 1", n)
			}
		})
	}
}

// The usage note said "1 of the calls were billed", and that plugin and
// batch calls cost the plugin price: batch jobs cost the batch price, and
// the tokens of a model that answered cost at least the model's prices.
func TestUsageNoteSaysHowCallsArePriced(t *testing.T) {
	c := &Console{logf: t.Logf}
	for estimated, want := range map[uint64]string{
		1: "1 of the calls was billed on tokens the gateway counted",
		2: "2 of the calls were billed on tokens the gateway counted",
	} {
		var ctx fasthttp.RequestCtx
		line := usageLine{Label: "Total", Estimated: estimated}
		c.render(&ctx, 200, "overview", pageData{Title: "Overview", Account: "acme",
			Page: overviewPage{Days: UsageDays, PerDay: []usageLine{line}, PerModel: []usageLine{line}, Total: line}})
		page := string(ctx.Response.Body())
		for _, w := range []string{want, "classify, tag, score and match calls at the plugin price and batch jobs at the batch price",
			"the higher of that price and the model's own prices"} {
			if !strings.Contains(page, w) {
				t.Errorf("%d estimated: the overview lacks %q:\n%s", estimated, w, page)
			}
		}
	}
}

// A clickhouse.dsn carrying a setting ClickHouse refuses (?sekure=true)
// is no outage that passes: the console logged it again at every overview
// past its 5 s backoff, and told the holder the billing store did not
// answer, to reload later. It logs it once, asks no more until a
// restart, and the page says only that usage is unavailable.
func TestOverviewWithARefusedDSNSetting(t *testing.T) {
	ch := chtest.Start(t)
	g := startGateway(t, ch.DSN()+"?sekure=true")
	b := g.browser()
	b.signIn("acme")
	for range 2 {
		status, page := b.get("/console")
		if status != 200 || !strings.Contains(page, `id="usage-unavailable"`) || strings.Contains(page, "did not answer") || strings.Contains(page, "Reload the page later") {
			t.Fatalf("overview: %d %s", status, page)
		}
		g.console.usage.mu.Lock()
		g.console.usage.failedAt = time.Now().Add(-time.Hour) // past the backoff
		g.console.usage.mu.Unlock()
	}
	if n := strings.Count(g.log.String(), "Unknown setting sekure"); n != 1 {
		t.Fatalf("the refused setting logged %d times, want once:\n%s", n, g.log)
	}
}

// A batch job that stopped twice bills three rows with its job_id; the
// console's months said 3 requests where the invoice, whose totals they
// show, says one job.
func TestUsageCountsABatchJobOnce(t *testing.T) {
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
	now := time.Now().UTC()
	event := func(id, jobID, endpoint string) *meter.Event {
		return &meter.Event{ID: id, JobID: jobID, Time: now, Account: "acme", KeyID: "k", Endpoint: endpoint, Model: "small",
			Upstream: "local", PromptTokens: 10, CompletionTokens: 2, CostNanos: 1000, UsageSource: meter.SourceUpstream, Status: 200}
	}
	job := uuid.NewString()
	events := []*meter.Event{
		event(uuid.NewString(), "", "/v1/chat/completions"),
		event(job+".1", job, "/v1/batch"), event(job+".2", job, "/v1/batch"), event(job, job, "/v1/batch"),
	}
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	u := &usageReader{dsn: ch.DSN(), logf: t.Logf}
	defer u.close()
	months, err := u.monthsSince(ctx, "acme", now)
	if err != nil {
		t.Fatal(err)
	}
	if len(months) != 1 || months[0].Requests != 2 {
		t.Fatalf("months %+v: want one month of 2 requests, a chat call and a batch job", months)
	}
}

// A ClickHouse stopped after the console had connected refuses each dial
// at once, and the console dialled it again on every page, logging
// "usage unavailable: … connection refused" each time (6 overviews, 6
// lines): only a timeout held it off. A refusal holds it off too.
func TestUsageBacksOffAClickHouseThatRefuses(t *testing.T) {
	ch := chtest.Start(t)
	sink, err := billing.OpenClickHouse(t.Context(), ch.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	sink.Close()
	g := startGateway(t, ch.DSN())
	b := g.browser()
	b.signIn("acme")
	if status, page := b.get("/console"); status != 200 || strings.Contains(page, `id="usage-unavailable"`) {
		t.Fatalf("overview with ClickHouse up: %d %s", status, page)
	}
	ch.Stop()
	for range 6 {
		if status, page := b.get("/console"); status != 200 || !strings.Contains(page, `id="usage-unavailable"`) {
			t.Fatalf("overview with ClickHouse stopped: %d %s", status, page)
		}
	}
	if n := strings.Count(g.log.String(), "usage unavailable"); n != 1 {
		t.Fatalf("6 overviews within the hold-off asked a stopped ClickHouse %d times, want once:\n%s", n, g.log)
	}
}
