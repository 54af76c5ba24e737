package main

import (
	"context"
	"errors"
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
// retrying…" each time. tollgate billing now exits with the error; serve
// logs it once and keeps trying, slowly and silently.
func TestBillingLoopOnARefusedDSNSetting(t *testing.T) {
	srv := chtest.Start(t)
	cfg := &config.Config{ClickHouse: config.ClickHouse{DSN: srv.DSN() + "?sekure=true"}}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := billingLoop(ctx, cfg, nil, nil, t.Logf, exitOnDSNSettings)
	var settingsErr *billing.DSNSettingsError
	if !errors.As(err, &settingsErr) {
		t.Fatalf("tollgate billing: got %v, want a DSNSettingsError", err)
	}

	defer func(was time.Duration) { dsnSettingsRetry = was }(dsnSettingsRetry)
	dsnSettingsRetry = 20 * time.Millisecond
	var mu sync.Mutex
	var logged []string
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, fmt.Sprintf(format, args...))
	}
	ctx, stop := context.WithTimeout(context.Background(), time.Second)
	defer stop()
	if err := billingLoop(ctx, cfg, nil, nil, logf, waitOnDSNSettings); err != nil {
		t.Fatalf("serve's loop returned %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Once, but again after another error came between (a ping that
	// timed out on a loaded machine says "unreachable", and the refusal
	// after it is news again): a line every 20 ms would fail this.
	refusals, others := 0, 0
	for _, line := range logged {
		if strings.Contains(line, "Unknown setting sekure") && strings.Contains(line, "restart serve") {
			refusals++
		} else {
			others++
		}
	}
	if refusals == 0 || refusals > others+1 {
		t.Fatalf("serve logged %q, want the refused setting once (and once more after each other error)", logged)
	}
}
