package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/chtest"
)

// A DSN whose settings ClickHouse refuses (?sekure=true) was retried
// every 30 s forever, logging "code: 115, Unknown setting sekure;
// retrying…" each time; a user or password it refuses was logged as
// "ClickHouse … unreachable" and retried the same way. tollgate billing
// now exits with the error; serve logs it once and keeps trying, slowly
// and silently.
func TestBillingLoopOnARefusedDSN(t *testing.T) {
	srv := chtest.Start(t)
	for _, c := range []struct {
		name, dsn, refusal string
	}{
		{"setting", srv.DSN() + "?sekure=true", "Unknown setting sekure"},
		{"password", strings.Replace(srv.DSN(), "clickhouse://", "clickhouse://default:not-its-password@", 1),
			"Wrong password for user default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &config.Config{ClickHouse: config.ClickHouse{DSN: c.dsn}}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := billingLoop(ctx, cfg, nil, nil, t.Logf, exitOnRefusedDSN)
			if !billing.IsDSNRefused(err) || !strings.Contains(fmt.Sprint(err), c.refusal) {
				t.Fatalf("tollgate billing: got %v, want ClickHouse refusing the DSN: %s", err, c.refusal)
			}
			if strings.Contains(err.Error(), "unreachable") || strings.Contains(err.Error(), "not-its-password") {
				t.Errorf("tollgate billing: %v", err)
			}

			defer func(was time.Duration) { refusedDSNRetry = was }(refusedDSNRetry)
			refusedDSNRetry = 20 * time.Millisecond
			var mu sync.Mutex
			var logged []string
			logf := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				logged = append(logged, fmt.Sprintf(format, args...))
			}
			ctx, stop := context.WithTimeout(context.Background(), time.Second)
			defer stop()
			if err := billingLoop(ctx, cfg, nil, nil, logf, waitOnRefusedDSN); err != nil {
				t.Fatalf("serve's loop returned %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			// Once, but again after another error came between (a ping that
			// timed out on a loaded machine says "unreachable", and the refusal
			// after it is news again): a line every 20 ms would fail this.
			refusals, others := 0, 0
			for _, line := range logged {
				if strings.Contains(line, c.refusal) && strings.Contains(line, "restart serve") {
					refusals++
				} else {
					others++
				}
			}
			if refusals == 0 || refusals > others+1 {
				t.Fatalf("serve logged %q, want the refusal once (and once more after each other error)", logged)
			}
		})
	}
}
