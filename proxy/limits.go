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
	// plugins.key_limits) and public calls per client address
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
	callers   map[string]*callerState
	lastSweep int64
}

// callerState is one caller's use. Guarded by its shard's mu.
type callerState struct {
	requestsTAT, tokensTAT int64 // unix ns
	// inFlight counts the plugin calls holding a concurrency slot;
	// generations counts the key's generation calls, which have no
	// concurrency limit but must keep the state from being swept while
	// they still charge their tokens to it.
	inFlight, generations int64
}

func newLimiter() *limiter {
	l := &limiter{seed: maphash.MakeSeed(), now: func() int64 { return time.Now().UnixNano() }}
	for i := range l.shards {
		l.shards[i].callers = map[string]*callerState{}
	}
	return l
}

// admission is one call's standing with the limiter.
type admission struct {
	l      *limiter
	shard  *limitShard
	caller string
	limits config.Limits
	public bool
	// generation: a generation call, which counts in generations instead
	// of taking a plugin concurrency slot.
	generation bool
	// state is set by a successful Admit; done releases its slot.
	state *callerState
	// admitted is the tokens a generation call was admitted with, an
	// estimate its usage settles (charge); settled once it has.
	admitted int64
	settled  bool
}

// admissionFor resolves who is calling and which limits hold for them.
func (l *limiter) admissionFor(ctx *fasthttp.RequestCtx, call *Call) *admission {
	plugins := call.World.Config.Plugins
	a := &admission{l: l}
	if call.Key != nil {
		a.caller = "key " + call.Key.ID
		a.limits = plugins.KeyLimits
		if call.Key.RPM > 0 {
			a.limits.RequestsPerMinute = call.Key.RPM
		}
		if call.Key.TPM > 0 {
			a.limits.TokensPerMinute = call.Key.TPM
		}
	} else {
		a.public = true
		a.caller = "addr " + clientSubject(l.clientAddr(ctx, call.World.Config))
		a.limits = plugins.PublicLimits
	}
	a.shard = &l.shards[maphash.String(l.seed, a.caller)%uint64(len(l.shards))]
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

// interval is the time cost units take of a limit per window, capped at two
// windows (a caller who overdraws is locked out at most that long).
func interval(cost, limit int64) int64 {
	if cost <= 0 || limit <= 0 {
		return 0
	}
	if limit <= math.MaxInt64/2 { // 2*limit of a larger one overflows
		cost = min(cost, 2*limit)
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
	a.shard.mu.Lock()
	st := a.shard.callers[a.caller]
	var snap callerState
	if st != nil {
		snap = *st
	}
	a.shard.mu.Unlock()
	if c := a.limits.Concurrent; c > 0 && snap.inFlight >= c {
		a.setHeaders(ctx, snap, now)
		return a.refuseConcurrent(ctx)
	}
	if rpm := a.limits.RequestsPerMinute; rpm > 0 {
		if next := max(snap.requestsTAT, now) + interval(1, rpm); next-now > limitWindow {
			a.setHeaders(ctx, snap, now)
			return a.refuse(ctx, "requests", rpm, 0, next-now-limitWindow)
		}
	}
	return nil
}

// admit takes one request and tokens from the caller's limits and a
// concurrency slot, all or nothing.
func (a *admission) admit(ctx *fasthttp.RequestCtx, tokens int64) *APIError {
	now := a.l.now()
	lim := a.limits
	sh := a.shard
	sh.mu.Lock()
	st := sh.callers[a.caller]
	if st == nil {
		sh.sweep(now)
		st = &callerState{}
		sh.callers[a.caller] = st
	}
	snap := *st
	var refusal func() *APIError
	nextReq := max(st.requestsTAT, now) + interval(1, lim.RequestsPerMinute)
	nextTok := max(st.tokensTAT, now) + interval(tokens, lim.TokensPerMinute)
	switch {
	case lim.Concurrent > 0 && st.inFlight >= lim.Concurrent:
		refusal = func() *APIError { return a.refuseConcurrent(ctx) }
	case lim.TokensPerMinute > 0 && tokens > lim.TokensPerMinute:
		refusal = func() *APIError { return a.refuse(ctx, "tokens", lim.TokensPerMinute, tokens, -1) }
	case lim.RequestsPerMinute > 0 && nextReq-now > limitWindow:
		refusal = func() *APIError { return a.refuse(ctx, "requests", lim.RequestsPerMinute, 0, nextReq-now-limitWindow) }
	case lim.TokensPerMinute > 0 && nextTok-now > limitWindow:
		refusal = func() *APIError { return a.refuse(ctx, "tokens", lim.TokensPerMinute, tokens, nextTok-now-limitWindow) }
	default:
		if lim.RequestsPerMinute > 0 {
			st.requestsTAT = nextReq
		}
		if lim.TokensPerMinute > 0 {
			st.tokensTAT = nextTok
		}
		if a.generation {
			st.generations++
		} else {
			st.inFlight++
		}
		snap = *st
		a.state = st
	}
	sh.mu.Unlock()
	a.setHeaders(ctx, snap, now)
	if refusal != nil {
		return refusal()
	}
	return nil
}

// addTokens charges tokens found after the work (an engine's prompt beyond
// the text). They may overdraw the minute; the next call then waits.
func (a *admission) addTokens(ctx *fasthttp.RequestCtx, tokens int64) {
	if a.state == nil || tokens == 0 || a.limits.TokensPerMinute <= 0 {
		return
	}
	snap, now := a.moveTokens(tokens)
	a.setHeaders(ctx, snap, now)
}

// moveTokens counts delta more tokens against the caller's minute, or,
// negative, gives them back (Admit counted more than the work used), but
// never past now, which would bank quota for later. It returns the
// caller's state after and the time it used.
func (a *admission) moveTokens(delta int64) (callerState, int64) {
	now := a.l.now()
	a.shard.mu.Lock()
	if delta > 0 {
		a.state.tokensTAT = max(a.state.tokensTAT, now) + interval(delta, a.limits.TokensPerMinute)
	} else {
		a.state.tokensTAT = max(a.state.tokensTAT-interval(-delta, a.limits.TokensPerMinute), now)
	}
	snap := *a.state
	a.shard.mu.Unlock()
	return snap, now
}

// done gives back the concurrency slot of an admitted call, and the
// estimate of a generation that ended without usage to settle it (a call
// refused after admission, the upstream's error passed on).
func (a *admission) done() {
	if a == nil || a.state == nil {
		return
	}
	if a.generation && !a.settled {
		a.charge(0)
	}
	a.shard.mu.Lock()
	if a.generation {
		a.state.generations--
	} else {
		a.state.inFlight--
	}
	a.shard.mu.Unlock()
	a.state = nil
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
	if a == nil || a.state == nil {
		return
	}
	a.charge(0)
	now := a.l.now()
	a.shard.mu.Lock()
	if rpm := a.limits.RequestsPerMinute; rpm > 0 {
		a.state.requestsTAT = max(a.state.requestsTAT-interval(1, rpm), now)
	}
	snap := *a.state
	a.shard.mu.Unlock()
	a.done()
	a.setHeaders(ctx, snap, now)
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

// setHeaders writes OpenAI's x-ratelimit-* headers for st at now.
func (a *admission) setHeaders(ctx *fasthttp.RequestCtx, st callerState, now int64) {
	h := &ctx.Response.Header
	for _, r := range []struct {
		name       string
		limit, tat int64
	}{{"requests", a.limits.RequestsPerMinute, st.requestsTAT}, {"tokens", a.limits.TokensPerMinute, st.tokensTAT}} {
		if r.limit <= 0 {
			continue
		}
		h.Set("x-ratelimit-limit-"+r.name, strconv.FormatInt(r.limit, 10))
		h.Set("x-ratelimit-remaining-"+r.name, strconv.FormatInt(remaining(r.tat, now, r.limit), 10))
		h.Set("x-ratelimit-reset-"+r.name, formatReset(max(r.tat-now, 0)))
	}
}

// formatReset writes a wait as OpenAI does: "1s", "6m0s", "120ms".
func formatReset(ns int64) string {
	return time.Duration(ns).Round(time.Millisecond).String()
}

func (a *admission) who() (subject, remedy string) {
	if a.public {
		return "requests without an API key from one client address", "; send an API key (Authorization: Bearer <API key>) for higher limits"
	}
	return "this API key", ""
}

// refuse builds the 429 for a rate. wait < 0 means the request can never
// pass (more tokens than the whole limit): no Retry-After then.
func (a *admission) refuse(ctx *fasthttp.RequestCtx, what string, limit, tokens, wait int64) *APIError {
	subject, remedy := a.who()
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
	if wait >= 0 {
		ctx.Response.Header.Set("Retry-After", strconv.FormatInt(max((wait+int64(time.Second)-1)/int64(time.Second), 1), 10))
	} else {
		// The OpenAI SDKs retry every 429 unless told not to: this one
		// would be refused the same each time.
		ctx.Response.Header.Set("x-should-retry", "false")
	}
	return errRateLimited(msg)
}

func (a *admission) refuseConcurrent(ctx *fasthttp.RequestCtx) *APIError {
	subject, remedy := a.who()
	ctx.Response.Header.Set("Retry-After", "1")
	return errRateLimited(fmt.Sprintf("too many requests at once: %s may have %d in flight; wait for one to finish%s",
		subject, a.limits.Concurrent, remedy))
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

// keyAdmission is the standing of a generation call whose key carries its
// own rpm or tpm; nil when it carries neither (generation has no default
// limits). It shares the key's rates with the plugin routes, so a key's
// limits hold across everything it calls, but not their concurrency
// limit: open streams must not fill plugins.key_limits.concurrent.
func (l *limiter) keyAdmission(key *accounts.Key) *admission {
	if key.RPM <= 0 && key.TPM <= 0 {
		return nil
	}
	a := &admission{l: l, caller: "key " + key.ID, generation: true,
		limits: config.Limits{RequestsPerMinute: key.RPM, TokensPerMinute: key.TPM}}
	a.shard = &l.shards[maphash.String(l.seed, a.caller)%uint64(len(l.shards))]
	return a
}

// charge settles a generation's tokens, known once its answer is complete,
// against the estimate it was admitted with, either way, without touching
// headers, which are sent by then.
func (a *admission) charge(tokens int64) {
	if a == nil || a.state == nil || a.limits.TokensPerMinute <= 0 {
		return
	}
	extra := tokens - a.admitted
	a.admitted, a.settled = tokens, true
	if extra != 0 {
		a.moveTokens(extra)
	}
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
