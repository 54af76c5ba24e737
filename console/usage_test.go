package console

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
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
