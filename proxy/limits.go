package proxy

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/config"
)

// LimitMode says how a plugin route is rate limited.
type LimitMode int

const (
	// LimitNone leaves the route unlimited (or limiting itself).
	LimitNone LimitMode = iota
	// LimitCaller limits keyed calls per key (the key's rpm/tpm, else
	// plugins.key_limits) and per account (the account's own limits, when
	// it has them), and public calls per client address
	// (plugins.public_limits). The handler must call Call.Admit once it
	// has validated the request and knows its tokens; until then the call
	// has used nothing, so a 400 costs no quota.
	LimitCaller
)

// limitWindow is the period requests_per_minute and tokens_per_minute count.
const limitWindow = int64(time.Minute)

// limiter holds the rate and concurrency state of every caller. Rates use
// GCRA: one "theoretical arrival time" per caller and rate, moved forward
// by cost × window/limit and refused while it would pass now + window.
// That is a bucket of a minute's limit refilled continuously (limit/60 a
// second), as OpenAI's own limits and its x-ratelimit-reset-* headers
// work: a caller idle for a minute may spend the whole limit at once, so
// the first minute after it admits up to twice the limit. It is one int64
// per rate, which changes of the limit on reload apply to at once.
type limiter struct {
	now     func() int64 // unix ns; a field so tests can move time
	seed    maphash.Seed
	shards  [64]limitShard
	trusted atomic.Pointer[trustedProxies]
}

type limitShard struct {
	mu        sync.Mutex
	callers   map[callerID]*callerState
	lastSweep int64
}

// callerKind says what a caller of the limiter is.
type callerKind uint8

const (
	callerKey callerKind = iota + 1
	callerAccount
	callerAddr
)

// callerID is whom limits count for: a key, an account or a client
// address. A struct rather than "key "+id, so that naming one allocates
// nothing.
type callerID struct {
	kind callerKind
	id   string
}

// callerState is one caller's use. Guarded by its shard's mu.
type callerState struct {
	requestsTAT, tokensTAT int64 // unix ns
	// inFlight counts the calls holding one of the caller's concurrency
	// slots (a key's plugin calls; an account's generation and plugin
	// calls); generations counts the calls that hold none, which must
	// keep the state from being swept while they still charge their
	// tokens to it.
	inFlight, generations int64
}

func newLimiter() *limiter {
	l := &limiter{seed: maphash.MakeSeed(), now: func() int64 { return time.Now().UnixNano() }}
	for i := range l.shards {
		l.shards[i].callers = map[callerID]*callerState{}
	}
	return l
}

func (l *limiter) shardOf(c callerID) int {
	return int((maphash.String(l.seed, c.id) + uint64(c.kind)) % uint64(len(l.shards)))
}

// admission is one call's standing with the limiter: with every set of
// limits it must pass together, the key's (or the client address's) and
// its account's.
type admission struct {
	l     *limiter
	parts [2]limitPart
	n     int // parts in use
	// generation: a generation call, admitted on an estimate of its
	// tokens that its usage settles (charge); settled once it has.
	generation, settled bool
	// account is the key's account. live counts its calls in flight, the
	// call's too when it takes a slot, whatever the account's limits: a
	// max_concurrent set later must count the calls already running, and
	// a tpm set later their usage. maxConcurrent is its limit at
	// admission, 0 for none.
	account       string
	live          *accounts.Live
	maxConcurrent int64
	// holding: admit took the call's slots and counts; done gives them
	// back.
	holding bool
}

// limitPart is a call's standing with one caller's limits.
type limitPart struct {
	shard  int // index in limiter.shards; parts lock in its order
	caller callerID
	limits config.Limits
	// slot: the call takes one of the caller's concurrency slots
	// (inFlight, bounded by limits.Concurrent); else it counts in
	// generations.
	slot bool
	// state is set by a successful admit; done releases it.
	state *callerState
	// admitted is the tokens the call was admitted with here.
	admitted int64
}

// add appends the limits of caller to the admission.
func (a *admission) add(caller callerID, limits config.Limits, slot bool) {
	a.parts[a.n] = limitPart{shard: a.l.shardOf(caller), caller: caller, limits: limits, slot: slot}
	a.n++
}

// accountPart adds the account's own rates, if it has any; slot says
// whether the call is one of the account's calls in flight, which live
// counts and max_concurrent bounds. live is nil for an account this
// gateway does not know.
func (a *admission) accountPart(account string, acct accounts.Limits, live *accounts.Live, slot bool) {
	a.account = account
	if slot && live != nil {
		a.live, a.maxConcurrent = live, acct.MaxConcurrent
	}
	lim := config.Limits{RequestsPerMinute: acct.RPM, TokensPerMinute: acct.TPM}
	if lim.RequestsPerMinute > 0 || lim.TokensPerMinute > 0 {
		a.add(callerID{callerAccount, account}, lim, slot)
	}
}

// admissionFor resolves who is calling and which limits hold for them:
// acct is the limits of the key's account, live its calls in flight.
func (l *limiter) admissionFor(ctx *fasthttp.RequestCtx, call *Call, acct accounts.Limits, live *accounts.Live) *admission {
	plugins := call.World.Config.Plugins
	a := &admission{l: l}
	if call.Key != nil {
		limits := plugins.KeyLimits
		if call.Key.RPM > 0 {
			limits.RequestsPerMinute = call.Key.RPM
		}
		if call.Key.TPM > 0 {
			limits.TokensPerMinute = call.Key.TPM
		}
		a.add(callerID{callerKey, call.Key.ID}, limits, true)
		a.accountPart(call.Key.Account, acct, live, true)
	} else {
		a.add(callerID{callerAddr, clientSubject(l.clientAddr(ctx, call.World.Config))}, plugins.PublicLimits, true)
	}
	return a
}

// clientSubject is what public limits count per: the address, or for IPv6
// its /64, which one subscriber usually holds whole.
func clientSubject(addr netip.Addr) string {
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}

// clientAddr is the TCP peer, or, when the peer is a trusted proxy, the
// last address of X-Forwarded-For that is not a trusted proxy: everything
// left of it was written by the client and proves nothing.
func (l *limiter) clientAddr(ctx *fasthttp.RequestCtx, cfg *config.Config) netip.Addr {
	peer, _ := netip.AddrFromSlice(ctx.RemoteIP())
	peer = peer.Unmap()
	tp := l.trustedFor(cfg)
	if !tp.contains(peer) {
		return peer
	}
	client := peer
	values := ctx.Request.Header.PeekAll("X-Forwarded-For")
	for i := len(values) - 1; i >= 0; i-- {
		hops := strings.Split(string(values[i]), ",")
		for j := len(hops) - 1; j >= 0; j-- {
			hop, ok := parseHop(hops[j])
			if !ok {
				return client // garbage: the last hop we could read is all we know
			}
			client = hop
			if !tp.contains(hop) {
				return hop
			}
		}
	}
	return client
}

func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

// trustedProxies is server.trusted_proxies parsed, for the config it was
// parsed from.
type trustedProxies struct {
	cfg      *config.Config
	prefixes []netip.Prefix
}

func (l *limiter) trustedFor(cfg *config.Config) *trustedProxies {
	if tp := l.trusted.Load(); tp != nil && tp.cfg == cfg {
		return tp
	}
	tp := &trustedProxies{cfg: cfg}
	for _, s := range cfg.Server.TrustedProxies {
		// config validated each entry as a CIDR or an address.
		if p, err := netip.ParsePrefix(s); err == nil {
			tp.prefixes = append(tp.prefixes, p.Masked())
		} else if a, err := netip.ParseAddr(s); err == nil {
			a = a.Unmap()
			tp.prefixes = append(tp.prefixes, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	l.trusted.Store(tp)
	return tp
}

func (tp *trustedProxies) contains(a netip.Addr) bool {
	for _, p := range tp.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// maxLockoutWindows is how many windows of its limit a caller's settled
// usage may run ahead of now: how long a caller who overdrew is locked out
// at most. Capped at two windows until 2026-11-27, a key with tpm 60 made
// a 4,010-token answer every 104 s, about 2,300 tokens a minute, whatever
// its limit; an hour still bounds what a usage no model could produce (an
// upstream's bogus billions of tokens) does to a key.
const maxLockoutWindows = 60

// interval is the time cost units take of a limit per window, capped at
// maxLockoutWindows windows.
func interval(cost, limit int64) int64 {
	if cost <= 0 || limit <= 0 {
		return 0
	}
	if limit <= math.MaxInt64/maxLockoutWindows { // the cap of a larger one overflows
		cost = min(cost, maxLockoutWindows*limit)
	}
	hi, lo := bits.Mul64(uint64(cost), uint64(limitWindow))
	q, _ := bits.Div64(hi, lo, uint64(limit))
	return int64(q)
}

// remaining is how many units of limit a caller whose TAT is tat may still
// use now.
func remaining(tat, now, limit int64) int64 {
	free := limitWindow - max(tat-now, 0)
	if free <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(free), uint64(limit))
	q, _ := bits.Div64(hi, lo, uint64(limitWindow))
	return int64(q)
}

// precheck refuses at once a caller who is over the request or concurrency
// limit, before the handler spends anything on the request. It uses nothing.
func (a *admission) precheck(ctx *fasthttp.RequestCtx) *APIError {
	now := a.l.now()
	var snaps [2]callerState
	for i := range a.n {
		p := &a.parts[i]
		sh := &a.l.shards[p.shard]
		sh.mu.Lock()
		if st := sh.callers[p.caller]; st != nil {
			snaps[i] = *st
		}
		sh.mu.Unlock()
	}
	for i := range a.n {
		p, snap := &a.parts[i], snaps[i]
		if c := p.limits.Concurrent; p.slot && c > 0 && snap.inFlight >= c {
			a.setHeaders(ctx, &snaps, now)
			return a.refuseConcurrent(ctx, p.caller, c)
		}
		if rpm := p.limits.RequestsPerMinute; rpm > 0 {
			if next := max(snap.requestsTAT, now) + interval(1, rpm); next-now > limitWindow {
				a.setHeaders(ctx, &snaps, now)
				return a.refuse(ctx, p, "requests", rpm, 0, next-now-limitWindow)
			}
		}
	}
	if a.accountBusy() {
		a.setHeaders(ctx, &snaps, now)
		return a.refuseAccountBusy(ctx)
	}
	return nil
}

// accountBusy reports whether the account has max_concurrent calls in
// flight already.
func (a *admission) accountBusy() bool {
	return a.live != nil && a.maxConcurrent > 0 && a.live.InFlight() >= a.maxConcurrent
}

// lock locks the shards of the admission's parts, in the order of their
// index, so two admissions never wait on each other.
func (a *admission) lock() {
	first, second := a.lockOrder()
	a.l.shards[first].mu.Lock()
	if second != first {
		a.l.shards[second].mu.Lock()
	}
}

func (a *admission) unlock() {
	first, second := a.lockOrder()
	if second != first {
		a.l.shards[second].mu.Unlock()
	}
	a.l.shards[first].mu.Unlock()
}

func (a *admission) lockOrder() (first, second int) {
	first, second = a.parts[0].shard, a.parts[0].shard
	if a.n == 2 {
		second = a.parts[1].shard
	}
	if second < first {
		first, second = second, first
	}
	return first, second
}

// admit takes one request and tokens from every part's limits and a
// concurrency slot, all or nothing. A generation's tokens are its prompt's
// estimate, counted at most up to each part's whole limit.
func (a *admission) admit(ctx *fasthttp.RequestCtx, tokens int64) *APIError {
	if a.n == 0 { // no rates: only the account's calls in flight to count
		if a.live == nil {
			return nil
		}
		if !a.live.Acquire(a.maxConcurrent) {
			return a.refuseAccountBusy(ctx)
		}
		a.holding = true
		return nil
	}
	now := a.l.now()
	a.lock()
	// Swept before any state is made below, which a sweep would forget.
	a.l.shards[a.parts[0].shard].sweep(now)
	if a.n == 2 {
		a.l.shards[a.parts[1].shard].sweep(now)
	}
	var states [2]*callerState
	var snaps [2]callerState
	var nextReq, nextTok, want [2]int64
	// The refusal is written once the shards are unlocked; not a closure,
	// whose captures would move these arrays to the heap at every call.
	refused, why := -1, ""
	for i := range a.n {
		p := &a.parts[i]
		st := a.l.shards[p.shard].state(p.caller)
		states[i], snaps[i] = st, *st
		lim := p.limits
		want[i] = tokens
		if a.generation && lim.TokensPerMinute > 0 {
			want[i] = min(tokens, lim.TokensPerMinute)
		}
		nextReq[i] = max(st.requestsTAT, now) + interval(1, lim.RequestsPerMinute)
		nextTok[i] = max(st.tokensTAT, now) + interval(want[i], lim.TokensPerMinute)
		if refused >= 0 {
			continue
		}
		switch {
		case p.slot && lim.Concurrent > 0 && st.inFlight >= lim.Concurrent:
			refused, why = i, "concurrent"
		case lim.TokensPerMinute > 0 && want[i] > lim.TokensPerMinute:
			refused, why = i, "too many tokens"
		case lim.RequestsPerMinute > 0 && nextReq[i]-now > limitWindow:
			refused, why = i, "requests"
		case lim.TokensPerMinute > 0 && nextTok[i]-now > limitWindow:
			refused, why = i, "tokens"
		}
	}
	// Last, once nothing else refuses: the account's count is not the
	// shards' to undo, so it is taken only when the call is admitted.
	accountBusy := refused < 0 && a.live != nil && !a.live.Acquire(a.maxConcurrent)
	if refused < 0 && !accountBusy {
		a.holding = true
		for i := range a.n {
			p, st := &a.parts[i], states[i]
			if p.limits.RequestsPerMinute > 0 {
				st.requestsTAT = nextReq[i]
			}
			if p.limits.TokensPerMinute > 0 {
				st.tokensTAT = nextTok[i]
			}
			if p.slot {
				st.inFlight++
			} else {
				st.generations++
			}
			snaps[i] = *st
			p.state, p.admitted = st, want[i]
		}
	}
	a.unlock()
	a.setHeaders(ctx, &snaps, now)
	if accountBusy {
		return a.refuseAccountBusy(ctx)
	}
	if refused < 0 {
		return nil
	}
	p, lim := &a.parts[refused], a.parts[refused].limits
	switch why {
	case "concurrent":
		return a.refuseConcurrent(ctx, p.caller, lim.Concurrent)
	case "too many tokens":
		return a.refuse(ctx, p, "tokens", lim.TokensPerMinute, want[refused], -1)
	case "requests":
		return a.refuse(ctx, p, "requests", lim.RequestsPerMinute, 0, nextReq[refused]-now-limitWindow)
	}
	return a.refuse(ctx, p, "tokens", lim.TokensPerMinute, want[refused], nextTok[refused]-now-limitWindow)
}

// holds reports whether admit took the call's slots (not yet done).
func (a *admission) holds() bool { return a != nil && a.holding }

// addTokens charges tokens found after the work (an engine's prompt beyond
// the text). They may overdraw the minute; the next call then waits.
func (a *admission) addTokens(ctx *fasthttp.RequestCtx, tokens int64) {
	if !a.holds() || tokens == 0 {
		return
	}
	var snaps [2]callerState
	var now int64
	for i := range a.n {
		snaps[i], now = a.moveTokens(&a.parts[i], tokens)
	}
	a.setHeaders(ctx, &snaps, now)
}

// moveTokens counts delta more tokens against p's minute, or, negative,
// gives them back (admit counted more than the work used), but never past
// now, which would bank quota for later. It returns the caller's state
// after and the time it used.
func (a *admission) moveTokens(p *limitPart, delta int64) (callerState, int64) {
	now := a.l.now()
	sh := &a.l.shards[p.shard]
	sh.mu.Lock()
	if tpm := p.limits.TokensPerMinute; tpm > 0 {
		if delta > 0 {
			p.state.tokensTAT = settledTAT(p.state.tokensTAT, now, delta, tpm)
		} else {
			p.state.tokensTAT = max(p.state.tokensTAT-interval(-delta, tpm), now)
		}
	}
	snap := *p.state
	sh.mu.Unlock()
	return snap, now
}

// done gives back the concurrency slots of an admitted call, and the
// estimate of a generation that ended without usage to settle it (a call
// refused after admission, the upstream's error passed on).
func (a *admission) done() {
	if !a.holds() {
		return
	}
	if a.generation && !a.settled {
		a.charge(0)
	}
	if a.n > 0 {
		a.lock()
		for i := range a.n {
			p := &a.parts[i]
			if p.slot {
				p.state.inFlight--
			} else {
				p.state.generations--
			}
			p.state = nil
		}
		a.unlock()
	}
	if a.live != nil {
		a.live.Release()
	}
	a.holding = false
}

// refused gives back all a generation call took at admission, its
// request too, when it is refused before reaching an upstream (a body
// that is not JSON, a model unknown or not allowed to its key): it cost
// nothing, as a plugin call refused before its Admit costs nothing. Its
// request used up the key's rpm: on rpm 3, three bad requests left the
// valid one after them a 429. The x-ratelimit headers admit set are
// written again. The request is given back no further than now, which
// would bank quota for later.
func (a *admission) refused(ctx *fasthttp.RequestCtx) {
	if !a.holds() {
		return
	}
	a.charge(0)
	if a.n == 0 {
		a.done()
		return
	}
	now := a.l.now()
	var snaps [2]callerState
	a.lock()
	for i := range a.n {
		p := &a.parts[i]
		if rpm := p.limits.RequestsPerMinute; rpm > 0 {
			p.state.requestsTAT = max(p.state.requestsTAT-interval(1, rpm), now)
		}
		snaps[i] = *p.state
	}
	a.unlock()
	a.done()
	a.setHeaders(ctx, &snaps, now)
}

// state is caller's state in the shard, made if it has none. mu must be
// held.
func (sh *limitShard) state(caller callerID) *callerState {
	st := sh.callers[caller]
	if st == nil {
		st = &callerState{}
		sh.callers[caller] = st
	}
	return st
}

// sweep forgets callers whose limits are whole again and who have nothing
// in flight, once a window, so memory follows recent traffic only. mu must
// be held.
func (sh *limitShard) sweep(now int64) {
	if now-sh.lastSweep < limitWindow {
		return
	}
	sh.lastSweep = now
	for k, st := range sh.callers {
		if st.inFlight == 0 && st.generations == 0 && st.requestsTAT <= now && st.tokensTAT <= now {
			delete(sh.callers, k)
		}
	}
}

// setHeaders writes OpenAI's x-ratelimit-* headers at now, for each of
// requests and tokens from the part with the least remaining: a call must
// pass both its key's and its account's limits, so that one is what the
// caller can still spend.
func (a *admission) setHeaders(ctx *fasthttp.RequestCtx, snaps *[2]callerState, now int64) {
	h := &ctx.Response.Header
	for _, name := range [...]string{"requests", "tokens"} {
		var limit, tat, left int64
		for i := range a.n {
			l, t := a.parts[i].limits.RequestsPerMinute, snaps[i].requestsTAT
			if name == "tokens" {
				l, t = a.parts[i].limits.TokensPerMinute, snaps[i].tokensTAT
			}
			if l <= 0 {
				continue
			}
			if r := remaining(t, now, l); limit == 0 || r < left {
				limit, tat, left = l, t, r
			}
		}
		if limit == 0 {
			continue
		}
		h.Set("x-ratelimit-limit-"+name, strconv.FormatInt(limit, 10))
		h.Set("x-ratelimit-remaining-"+name, strconv.FormatInt(left, 10))
		h.Set("x-ratelimit-reset-"+name, formatReset(max(tat-now, 0)))
	}
}

// formatReset writes a wait as OpenAI does: "1s", "6m0s", "120ms".
func formatReset(ns int64) string {
	return time.Duration(ns).Round(time.Millisecond).String()
}

// public reports whether the call has no key: it is limited per client
// address, its one part.
func (a *admission) public() bool { return a.parts[0].caller.kind == callerAddr }

func (a *admission) who(caller callerID) (subject, remedy string) {
	switch {
	case caller.kind == callerAddr:
		return "requests without an API key from one client address", "; send an API key (Authorization: Bearer <API key>) for higher limits"
	case caller.kind == callerAccount:
		return "account " + caller.id + " (all its keys together)", ""
	}
	return "this API key", ""
}

// refuse builds the 429 for a rate of p. wait < 0 means the request can
// never pass (more tokens than the whole limit): no Retry-After then.
func (a *admission) refuse(ctx *fasthttp.RequestCtx, p *limitPart, what string, limit, tokens, wait int64) *APIError {
	subject, remedy := a.who(p.caller)
	var msg string
	switch {
	case wait < 0:
		msg = fmt.Sprintf("this request has %d tokens, more than the %d tokens per minute allowed to %s; shorten the text%s", tokens, limit, subject, remedy)
	case what == "tokens" && a.generation:
		// A generation call counts its prompt's estimate until its usage
		// is known.
		msg = fmt.Sprintf("rate limit reached for tokens: %s may use %d tokens per minute, and its calls so far with this one's prompt (about %d tokens) would pass them; try again in %s%s",
			subject, limit, tokens, formatReset(wait), remedy)
	case what == "tokens":
		msg = fmt.Sprintf("rate limit reached for tokens: %s may use %d tokens per minute and this request has %d; try again in %s%s",
			subject, limit, tokens, formatReset(wait), remedy)
	default:
		msg = fmt.Sprintf("rate limit reached for requests: %s may make %d per minute; try again in %s%s",
			subject, limit, formatReset(wait), remedy)
	}
	e := errRateLimited(msg)
	if wait >= 0 {
		e.RetryAfter = time.Duration(wait)
	} else {
		// The OpenAI SDKs retry every 429 unless told not to: this one
		// would be refused the same each time.
		e.NoRetry = true
	}
	// On ctx now, as admit's x-ratelimit headers are (setHeaders): the
	// refusal is whole there before WriteError, which writes the same.
	setRetryHeaders(&ctx.Response.Header, e)
	return e
}

// refuseAccountBusy is refuseConcurrent for the account's max_concurrent,
// counted by its Live rather than by a part.
func (a *admission) refuseAccountBusy(ctx *fasthttp.RequestCtx) *APIError {
	return a.refuseConcurrent(ctx, callerID{callerAccount, a.account}, a.maxConcurrent)
}

func (a *admission) refuseConcurrent(ctx *fasthttp.RequestCtx, caller callerID, limit int64) *APIError {
	subject, remedy := a.who(caller)
	SetRetryAfter(&ctx.Response.Header, time.Second)
	return errRateLimited(fmt.Sprintf("too many requests at once: %s may have %d in flight; wait for one to finish%s",
		subject, limit, remedy))
}

func errRateLimited(msg string) *APIError {
	return &APIError{Status: 429, Type: "rate_limit_error", Code: "rate_limit_exceeded", Message: msg}
}

// Admit counts the call against its caller's limits: one request, tokens
// (the request's text as tokens.Count sees it) and a concurrency slot held
// until the handler returns. A refusal is the 429 to write; the x-ratelimit
// headers are set either way. Call it once, after validating the request
// and before doing the work; on a route without limits it does nothing.
func (c *Call) Admit(ctx *fasthttp.RequestCtx, tokens int64) *APIError {
	if c.limit == nil {
		return nil
	}
	return c.limit.admit(ctx, tokens)
}

// AddTokens settles what Admit counted against what the work used: it
// charges the tokens beyond (a prompt longer than the text), and gives
// back those Admit estimated and the work did not use.
func (c *Call) AddTokens(ctx *fasthttp.RequestCtx, tokens int64) {
	if c.limit != nil {
		c.limit.addTokens(ctx, tokens)
	}
}

// Refused gives back all Admit took, the request and its tokens, from a
// call the gateway answered with its own error before any work was spent
// on it: a model whose upstreams all refused the connection costs no
// quota, as a generation call refused before it reaches an upstream does
// not (the SDKs retry a 503 twice). Call it instead of AddTokens; the
// x-ratelimit headers are written again.
func (c *Call) Refused(ctx *fasthttp.RequestCtx) {
	c.limit.refused(ctx)
}

// generationAdmission is the standing of a generation call (or a call on
// a stored response, slot false) under its key's own rpm and tpm and its
// account's limits acct; with no parts when neither has any rates
// (generation has no default limits). The key's part shares the key's
// rates with the plugin routes, so a key's limits hold across everything
// it calls, but not their concurrency limit: open streams must not fill
// plugins.key_limits.concurrent. When slot is set the call counts among
// the account's calls in flight (live), against max_concurrent. A value,
// which the call keeps: an admission for every call allocated nothing.
func (l *limiter) generationAdmission(key *accounts.Key, acct accounts.Limits, live *accounts.Live, slot bool) admission {
	a := admission{l: l, generation: true}
	if key.RPM > 0 || key.TPM > 0 {
		a.add(callerID{callerKey, key.ID}, config.Limits{RequestsPerMinute: key.RPM, TokensPerMinute: key.TPM}, false)
	}
	a.accountPart(key.Account, acct, live, slot)
	return a
}

// tokenLimit is the largest tokens per minute of the admission's parts, 0
// when none limits tokens: what a generation's estimate is worth making.
func (a *admission) tokenLimit() int64 {
	var most int64
	for i := range a.n {
		most = max(most, a.parts[i].limits.TokensPerMinute)
	}
	return most
}

// charge settles a generation's tokens, known once its answer is complete,
// against the estimate it was admitted with, either way, without touching
// headers, which are sent by then.
func (a *admission) charge(tokens int64) {
	if !a.holds() {
		return
	}
	a.settled = true
	accountCounted := false
	for i := range a.n {
		p := &a.parts[i]
		if p.limits.TokensPerMinute <= 0 {
			continue
		}
		accountCounted = accountCounted || p.caller.kind == callerAccount
		extra := tokens - p.admitted
		p.admitted = tokens
		if extra != 0 {
			a.moveTokens(p, extra)
		}
	}
	// A tpm set on the account while the call ran counts its usage: the
	// call was admitted with no part to charge it to.
	if !accountCounted && tokens > 0 && a.live != nil {
		if tpm := a.live.TPM(); tpm > 0 {
			a.l.chargeAccount(a.account, tokens, tpm)
		}
	}
}

// chargeAccount counts tokens against account's tpm, as moveTokens does
// for a call's part: for a call admitted before the account had a tpm.
func (l *limiter) chargeAccount(account string, tokens, tpm int64) {
	caller := callerID{callerAccount, account}
	now := l.now()
	sh := &l.shards[l.shardOf(caller)]
	sh.mu.Lock()
	sh.sweep(now)
	st := sh.state(caller)
	st.tokensTAT = settledTAT(st.tokensTAT, now, tokens, tpm)
	sh.mu.Unlock()
}

// settledTAT is a tokens TAT with tokens used more under tpm, settled
// after the work: calls settled one after another stack up to the same
// lock-out as one call that used all their tokens, maxLockoutWindows.
func settledTAT(tat, now, tokens, tpm int64) int64 {
	return min(max(tat, now)+interval(tokens, tpm), now+maxLockoutWindows*limitWindow)
}

// promptEstimate is what a generation request counts against its key's
// tokens per minute until its usage is known: a quarter of its bytes,
// about what the o200k tokenizer makes of English and JSON, without the
// payloads of images, files and audio (an image's base64 is not a token
// per 4 bytes of it), and at most the limit, so an estimate alone never
// refuses a call as too large. Counting nothing until the usage came let
// a key's calls in flight pass its limit together: 100 concurrent streams
// took 10M tokens on tpm 1,000.
func promptEstimate(body []byte, limit int64) int64 {
	n := len(body)
	if bytes.Contains(body, base64Marker) || bytes.Contains(body, inputAudioKey) {
		n -= mediaBytes(body)
	}
	return min(int64(max(n, 0)/4), limit)
}

var (
	base64Marker  = []byte(";base64,")
	inputAudioKey = []byte(`"input_audio"`)
)

// mediaFields are where a content part of chat (messages[].content[]) or
// responses (input[].content[]) carries a payload: image_url.url and
// file.file_data in chat, image_url and file_data in responses' input_image
// and input_file parts, input_audio.data in chat. Only these: searching
// the body for ";base64," let text after a "data:…;base64," of its own (or
// after an escaped quote) pass uncounted, 109,000 tokens through a tpm of
// 10,000 in one burst.
var mediaFields = [...]string{"image_url.url", "file.file_data", "image_url", "file_data", "input_audio.data"}

// mediaBytes is how many bytes of body the payloads in mediaFields take,
// the data URLs among the URLs and file data, all of the audio.
func mediaBytes(body []byte) int {
	total := 0
	part := func(_, p gjson.Result) bool {
		for _, f := range mediaFields {
			v := p.Get(f)
			if v.Type != gjson.String {
				continue
			}
			if f == "input_audio.data" || isBase64DataURL(v.Str) {
				total += len(v.Raw)
			}
		}
		return true
	}
	root := gjson.Parse(bstr(body))
	for _, list := range [...]string{"messages", "input"} {
		root.Get(list).ForEach(func(_, item gjson.Result) bool {
			item.Get("content").ForEach(part)
			return true
		})
	}
	return total
}

// isBase64DataURL reports whether s is data:[<media type>];base64,<data>.
func isBase64DataURL(s string) bool {
	comma := strings.IndexByte(s, ',')
	return strings.HasPrefix(s, "data:") && comma > 0 && strings.HasSuffix(s[:comma], ";base64")
}
