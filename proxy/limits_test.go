package proxy

import (
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/config"
)

// limitCtx is a request from peer with the given X-Forwarded-For values.
func limitCtx(peer string, xff ...string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	for _, v := range xff {
		req.Header.Add("X-Forwarded-For", v)
	}
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, &net.TCPAddr{IP: net.ParseIP(peer), Port: 40000}, nil)
	return ctx
}

func TestClientAddr(t *testing.T) {
	cfg := &config.Config{Server: config.Server{TrustedProxies: []string{"10.0.0.0/8", "192.0.2.1", "::1"}}}
	l := newLimiter()
	for _, c := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"203.0.113.1", nil, "203.0.113.1"},
		{"203.0.113.1", []string{"198.51.100.1"}, "203.0.113.1"}, // peer not trusted: XFF is a claim
		{"10.1.2.3", nil, "10.1.2.3"},
		{"10.1.2.3", []string{"198.51.100.1"}, "198.51.100.1"},
		{"10.1.2.3", []string{"6.6.6.6, 198.51.100.1, 10.9.9.9"}, "198.51.100.1"},    // last untrusted hop
		{"10.1.2.3", []string{"6.6.6.6", "198.51.100.1, 192.0.2.1"}, "198.51.100.1"}, // several headers, in order
		{"10.1.2.3", []string{"10.0.0.5, 10.0.0.6"}, "10.0.0.5"},                     // all trusted: the first
		{"10.1.2.3", []string{"198.51.100.1, garbage"}, "10.1.2.3"},                  // unreadable: stop at what is known
		{"10.1.2.3", []string{"198.51.100.1:5555"}, "198.51.100.1"},
		{"::1", []string{"[2001:db8::1]:443"}, "2001:db8::1"},
		{"::ffff:10.1.2.3", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
	} {
		got := l.clientAddr(limitCtx(c.peer, c.xff...), cfg)
		if got.String() != c.want {
			t.Errorf("peer %s, XFF %q: client %s, want %s", c.peer, c.xff, got, c.want)
		}
	}
}

// fakeClock lets a test move the limiter's time.
type fakeClock struct{ ns int64 }

func (c *fakeClock) now() int64              { return c.ns }
func (c *fakeClock) advance(d time.Duration) { c.ns += int64(d) }

// testAdmission is a plugin call's admission under lim alone, in shard 0.
func testAdmission(l *limiter, caller string, lim config.Limits) *admission {
	a := &admission{l: l, n: 1}
	a.parts[0] = limitPart{caller: callerID{callerKey, caller}, limits: lim, slot: true}
	return a
}

func TestAdmitRates(t *testing.T) {
	clock := &fakeClock{ns: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	l := newLimiter()
	l.now = clock.now
	lim := config.Limits{RequestsPerMinute: 3, TokensPerMinute: 600, Concurrent: config.NoLimit}
	for i := range 3 {
		a := testAdmission(l, "key k", lim)
		ctx := limitCtx("127.0.0.1")
		if err := a.admit(ctx, 100); err != nil {
			t.Fatalf("call %d refused: %v", i, err)
		}
		if got := string(ctx.Response.Header.Peek("x-ratelimit-remaining-requests")); got != strconv.Itoa(2-i) {
			t.Errorf("call %d: remaining-requests %s, want %d", i, got, 2-i)
		}
		a.done()
	}
	ctx := limitCtx("127.0.0.1")
	err := testAdmission(l, "key k", lim).admit(ctx, 1)
	if err == nil || err.Status != 429 {
		t.Fatalf("4th call in a minute: %v, want 429", err)
	}
	// Three requests of a 3/min budget come back one per 20 s.
	if ra := string(ctx.Response.Header.Peek("Retry-After")); ra != "20" {
		t.Errorf("Retry-After %s, want 20", ra)
	}
	if reset := string(ctx.Response.Header.Peek("x-ratelimit-reset-requests")); reset != "1m0s" {
		t.Errorf("reset-requests %s, want 1m0s", reset)
	}
	if rt := string(ctx.Response.Header.Peek("x-ratelimit-remaining-tokens")); rt != "300" {
		t.Errorf("remaining-tokens %s, want 300", rt)
	}
	clock.advance(20 * time.Second)
	if err := testAdmission(l, "key k", lim).admit(limitCtx("127.0.0.1"), 1); err != nil {
		t.Errorf("after 20 s: %v", err)
	}
	// Tokens come back at 10 per second: by now all 600 are there.
	clock.advance(40 * time.Second)
	if err := testAdmission(l, "key k", lim).admit(limitCtx("127.0.0.1"), 500); err != nil {
		t.Fatalf("500 of 600 tokens: %v", err)
	}
	ctx = limitCtx("127.0.0.1")
	if err := testAdmission(l, "key k", lim).admit(ctx, 200); err == nil {
		t.Errorf("200 tokens with %s left admitted", ctx.Response.Header.Peek("x-ratelimit-remaining-tokens"))
	}
	if ra := string(ctx.Response.Header.Peek("Retry-After")); ra != "10" {
		t.Errorf("Retry-After %s for 100 tokens missing at 10/s, want 10", ra)
	}
	ctx = limitCtx("127.0.0.1")
	if err := testAdmission(l, "key k", lim).admit(ctx, 700); err == nil || err.Status != 429 {
		t.Errorf("700 tokens of a 600/min limit: %v", err)
	}
	// It would be refused the same each time: the SDKs must not retry it.
	if got := string(ctx.Response.Header.Peek("x-should-retry")); got != "false" {
		t.Errorf("x-should-retry %q on a request above the whole limit", got)
	}
	// A limit of -1 is no limit and sends no headers.
	ctx = limitCtx("127.0.0.1")
	free := config.Limits{RequestsPerMinute: config.NoLimit, TokensPerMinute: config.NoLimit, Concurrent: config.NoLimit}
	for range 100 {
		if err := testAdmission(l, "key free", free).admit(ctx, 1<<40); err != nil {
			t.Fatal(err)
		}
	}
	if h := ctx.Response.Header.Peek("x-ratelimit-limit-requests"); h != nil {
		t.Errorf("x-ratelimit-limit-requests %q without a limit", h)
	}
}

func TestAdmitConcurrencyAndSweep(t *testing.T) {
	clock := &fakeClock{ns: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	l := newLimiter()
	l.now = clock.now
	lim := config.Limits{RequestsPerMinute: 1000, TokensPerMinute: 1000, Concurrent: 2}
	a, b := testAdmission(l, "addr x", lim), testAdmission(l, "addr x", lim)
	if a.admit(limitCtx("127.0.0.1"), 1) != nil || b.admit(limitCtx("127.0.0.1"), 1) != nil {
		t.Fatal("two calls of two refused")
	}
	c := testAdmission(l, "addr x", lim)
	ctx := limitCtx("127.0.0.1")
	if err := c.precheck(ctx); err == nil {
		t.Error("precheck passed a third concurrent call")
	}
	// Every 429 carries the x-ratelimit-* headers.
	if got := string(ctx.Response.Header.Peek("x-ratelimit-limit-requests")); got != "1000" {
		t.Errorf("x-ratelimit-limit-requests %q on the concurrency 429", got)
	}
	if err := c.admit(limitCtx("127.0.0.1"), 1); err == nil {
		t.Error("third concurrent call admitted")
	}
	a.done()
	a.done() // a second done gives back nothing
	if err := c.admit(limitCtx("127.0.0.1"), 1); err != nil {
		t.Errorf("after one ended: %v", err)
	}
	if err := testAdmission(l, "addr x", lim).admit(limitCtx("127.0.0.1"), 1); err == nil {
		t.Error("a double done freed two slots")
	}
	b.done()
	c.done()
	// Idle callers are forgotten once their minute has passed.
	clock.advance(2 * time.Minute)
	if err := testAdmission(l, "addr y", lim).admit(limitCtx("127.0.0.1"), 1); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.shards[0].callers[callerID{callerKey, "addr x"}]; ok {
		t.Error("an idle caller survived the sweep")
	}
	if _, ok := l.shards[0].callers[callerID{callerKey, "addr y"}]; !ok {
		t.Error("the active caller was swept")
	}
}

// TestAdmissionFor: a key's own rpm/tpm replace key_limits; public callers
// get public_limits and are told apart by address.
func TestAdmissionFor(t *testing.T) {
	cfg := &config.Config{Plugins: config.Plugins{
		PublicLimits: config.Limits{RequestsPerMinute: 1, TokensPerMinute: 10, Concurrent: 1},
		KeyLimits:    config.Limits{RequestsPerMinute: 600, TokensPerMinute: 1000, Concurrent: 16},
	}}
	l := newLimiter()
	w := &World{Config: cfg}
	a := l.admissionFor(limitCtx("203.0.113.1"), &Call{World: w, Key: &accounts.Key{ID: "k1", Account: "acme", RPM: 5}}, accounts.Limits{}, nil)
	if a.n != 1 || a.parts[0].caller != (callerID{callerKey, "k1"}) || a.public() || a.parts[0].limits != (config.Limits{RequestsPerMinute: 5, TokensPerMinute: 1000, Concurrent: 16}) {
		t.Errorf("keyed admission %+v", a)
	}
	// An account with limits of its own adds them: the call must pass both.
	// Its calls in flight are counted by its Live, not by a part.
	live := new(accounts.Live)
	a = l.admissionFor(limitCtx("203.0.113.1"), &Call{World: w, Key: &accounts.Key{ID: "k1", Account: "acme"}}, accounts.Limits{TPM: 50, MaxConcurrent: 2}, live)
	if a.n != 2 || a.parts[1].caller != (callerID{callerAccount, "acme"}) || a.parts[1].limits != (config.Limits{TokensPerMinute: 50}) || !a.parts[1].slot ||
		a.live != live || a.maxConcurrent != 2 {
		t.Errorf("keyed admission of a limited account %+v", a)
	}
	a = l.admissionFor(limitCtx("2001:db8:1:2:3:4:5:6"), &Call{World: w}, accounts.Limits{}, nil)
	if a.n != 1 || a.parts[0].caller != (callerID{callerAddr, "2001:db8:1:2::/64"}) || !a.public() || a.parts[0].limits != cfg.Plugins.PublicLimits {
		t.Errorf("public admission %+v", a)
	}
}

// TestGenerationsTakeNoPluginSlot: a key with its own rpm shares its rates
// with the plugin routes, but its open generation calls do not fill
// plugins.key_limits.concurrent, and they keep its state from being swept
// while they last (their tokens are charged to it when they end).
func TestGenerationsTakeNoPluginSlot(t *testing.T) {
	clock := &fakeClock{ns: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	l := newLimiter()
	l.now = clock.now
	key := &accounts.Key{ID: "k", RPM: 1000, TPM: 100_000}
	var streams []*admission
	for range 20 {
		g := l.generationAdmission(key, accounts.Limits{}, nil, true)
		if err := g.admit(limitCtx("127.0.0.1"), 0); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, &g)
	}
	plugin := &admission{l: l}
	plugin.add(callerID{callerKey, "k"}, config.Limits{RequestsPerMinute: 1000, TokensPerMinute: 100_000, Concurrent: 16}, true)
	if err := plugin.precheck(limitCtx("127.0.0.1")); err != nil {
		t.Fatalf("a plugin call with 20 generations open: %v", err)
	}
	if err := plugin.admit(limitCtx("127.0.0.1"), 1); err != nil {
		t.Fatalf("a plugin call with 20 generations open: %v", err)
	}
	plugin.done()
	// The requests count against the shared rate all the same.
	shard := &l.shards[plugin.parts[0].shard]
	st := shard.callers[callerID{callerKey, "k"}]
	if remaining(st.requestsTAT, clock.now(), 1000) != 1000-21 {
		t.Errorf("remaining requests %d, want %d", remaining(st.requestsTAT, clock.now(), 1000), 1000-21)
	}
	clock.advance(5 * time.Minute)
	shard.sweep(clock.now())
	if shard.callers[callerID{callerKey, "k"}] != st {
		t.Fatal("the state of a key with generations open was swept")
	}
	for _, g := range streams {
		g.charge(100)
		g.done()
	}
	if st.tokensTAT <= clock.now() {
		t.Error("the generations' tokens were not charged")
	}
}

// TestHugeLimits: a limit too large to double (rpm 2^62 and up) admits,
// where 2*limit once overflowed into a two-minute lock-out.
func TestHugeLimits(t *testing.T) {
	l := newLimiter()
	for _, limit := range []int64{1 << 62, math.MaxInt64} {
		lim := config.Limits{RequestsPerMinute: limit, TokensPerMinute: limit, Concurrent: config.NoLimit}
		for i := range 3 {
			a := testAdmission(l, "key "+strconv.FormatInt(limit, 10), lim)
			if err := a.admit(limitCtx("127.0.0.1"), 1000); err != nil {
				t.Fatalf("limit %d, call %d: %v", limit, i, err)
			}
			a.done()
		}
	}
}

// A call's usage counts against tpm in full, up to an hour of the limit:
// capped at two minutes, a key with tpm 60 made a 4,010-token answer every
// 104 s, about 2,300 tokens a minute.
func TestSettledUsageLocksOutForAllItsTokensUpToAnHour(t *testing.T) {
	clock := &fakeClock{ns: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	l := newLimiter()
	l.now = clock.now
	key := &accounts.Key{ID: "k", TPM: 60}
	lockedOutFor := func(used int64) time.Duration {
		g := l.generationAdmission(key, accounts.Limits{}, nil, true)
		if err := g.admit(limitCtx("127.0.0.1"), 10); err != nil {
			t.Fatalf("a call after the lock-out ended: %v", err)
		}
		g.charge(used)
		g.done()
		st := l.shards[g.parts[0].shard].callers[callerID{callerKey, "k"}]
		return time.Duration(st.tokensTAT - clock.now())
	}
	if d := lockedOutFor(300); d != 5*time.Minute {
		t.Fatalf("300 tokens at tpm 60 locked the key out for %s, want 5m", d)
	}
	clock.advance(5 * time.Minute)
	if d := lockedOutFor(4010); d != time.Hour {
		t.Fatalf("4,010 tokens at tpm 60 locked the key out for %s, want the hour's cap", d)
	}
	g := l.generationAdmission(key, accounts.Limits{}, nil, true)
	if err := g.admit(limitCtx("127.0.0.1"), 10); err == nil {
		t.Fatal("a call was admitted during the lock-out")
	}
	clock.advance(time.Hour)
	if d := lockedOutFor(200); d != 200*time.Second {
		t.Fatalf("after the hour, 200 tokens locked the key out for %s, want 3m20s", d)
	}
}

// A plugin call is refused before its body is worked on when its account
// has max_concurrent calls in flight, counted whatever its limits were
// when they started, and its Admit takes one of them.
func TestPluginCallCountsAmongTheAccountsCallsInFlight(t *testing.T) {
	l := newLimiter()
	w := &World{Config: &config.Config{}}
	live := new(accounts.Live)
	key := &accounts.Key{ID: "k1", Account: "acme"}
	running := l.generationAdmission(key, accounts.Limits{}, live, true)
	if err := running.admit(limitCtx("127.0.0.1"), 0); err != nil || live.InFlight() != 1 {
		t.Fatalf("a call without limits: %v, %d in flight", err, live.InFlight())
	}
	a := l.admissionFor(limitCtx("127.0.0.1"), &Call{World: w, Key: key}, accounts.Limits{MaxConcurrent: 1}, live)
	if err := a.precheck(limitCtx("127.0.0.1")); err == nil || !strings.Contains(err.Message, "account acme (all its keys together) may have 1 in flight") {
		t.Fatalf("precheck with the account's one call in flight: %v", err)
	}
	running.done()
	if err := a.admit(limitCtx("127.0.0.1"), 1); err != nil || live.InFlight() != 1 {
		t.Fatalf("admit once it ended: %v, %d in flight", err, live.InFlight())
	}
	a.done()
	if live.InFlight() != 0 {
		t.Fatalf("%d in flight after every call ended", live.InFlight())
	}
}
