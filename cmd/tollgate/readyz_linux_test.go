package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// A gateway whose outbox disk is full while NATS is down answers calls
// and drops their usage events, unbilled, while /healthz says ok: a
// load balancer kept it in rotation. /readyz says 503, and why, before
// the first event is refused, and 200 again once the disk has room, with
// no call made meanwhile (a gateway out of rotation gets none).
func TestReadyzSaysTheOutboxRefusesEvents(t *testing.T) {
	disk := testutil.SmallDisk(t, 4<<20)
	g := gatewaytest.Start(t, gatewaytest.Options{
		NoListen: true,
		Upstream: &proxytest.Options{},
		Config: func(upstream, _ string) string {
			return smallModelConfig(upstream, disk, "", "billing:\n  outbox_max_bytes: 1MiB\n") // 128 KiB segments
		},
	})
	cfg, err := config.Load(g.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClickHouse.ConsumeInServe = false
	// The NATS the usage events go to, apart from the accounts' so that
	// it can be stopped alone.
	ctx := context.Background()
	billingNATS, err := broker.Start(ctx, config.NATS{EmbeddedListen: "127.0.0.1:0"}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(billingNATS.Close)
	var log testutil.Log
	rec, closeRecorder, err := openRecorder(ctx, cfg, billingNATS, g.Accounts, log.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeRecorder)
	srv, err := proxy.New(cfg, proxy.Options{Accounts: g.Accounts, Recorder: rec, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	url := gatewaytest.Serve(t, srv)
	g.CreateAccount("acme", money.Nanos(5_000_000_000))
	key := g.CreateKey("acme", accounts.KeyRequest{Name: "k"})
	call := func() {
		t.Helper()
		resp := postChat(t, url, key, `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call: %d", resp.StatusCode)
		}
	}
	call()
	if r := getReadyz(t, http.MethodGet, url+"/readyz"); r.status != http.StatusOK {
		t.Fatalf("/readyz: %d %s, want 200", r.status, r.body)
	}

	billingNATS.Close() // the events wait in the outbox
	filler := testutil.FillDisk(t, disk)
	calls := 0
	for ; ; calls++ {
		if calls == 5000 {
			t.Fatalf("/readyz still 200 after %d calls on a full disk with NATS down; %d events dropped", calls, rec.Stats().Dropped)
		}
		if r := getReadyz(t, http.MethodGet, url+"/readyz"); r.status != http.StatusOK {
			want := "billing outbox refuses events: no room on its disk for a new segment"
			if r.status != http.StatusServiceUnavailable || len(r.reasons) != 1 || r.reasons[0] != want {
				t.Fatalf("/readyz on the full disk: %d %s, want 503 saying %q", r.status, r.body, want)
			}
			break
		}
		call()
	}
	if n := rec.Stats().Dropped; n != 0 {
		t.Errorf("%d events dropped before /readyz said 503 (after %d calls): %q", n, calls, log.Matching("DROPPED"))
	}
	t.Logf("/readyz 503 after %d calls", calls)
	hz, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	hz.Body.Close()
	if hz.StatusCode != http.StatusOK {
		t.Errorf("/healthz on the full disk: %d, want 200 (liveness)", hz.StatusCode)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if r := getReadyz(t, http.MethodGet, url+"/readyz"); r.status != http.StatusOK {
			return fmt.Errorf("/readyz once the disk has room: %d %s", r.status, r.body)
		}
		return nil
	})
}
