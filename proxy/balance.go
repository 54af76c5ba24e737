package proxy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/config"
)

// A model's pool is the upstreams that serve it. Every call picks one that
// is not ejected (balance), may move on to another before the first byte
// reaches the client (retries), and reports how the attempt went (health),
// which ejects upstreams that keep failing and brings them back.

// Breaker states of an upstream.
const (
	stateClosed   int32 = iota // serving
	stateOpen                  // ejected until openUntil
	stateHalfOpen              // one trial call decides
)

// upstreamHealth is an upstream's load and circuit breaker. It lives in the
// upstream, so a reload that keeps the upstream keeps its state.
type upstreamHealth struct {
	// inflight counts the calls with the upstream, made by newUpstream
	// and shared by its later selves (carryFrom): a call ends on the
	// upstream it started on.
	inflight *atomic.Int64
	latency  atomic.Int64 // moving average of the time to the answer's first byte, ns
	sampled  atomic.Int64 // unix ns of latency's last sample
	// answered is the moving average of the first bytes that came,
	// without the waits of calls whose clients left (latency has them),
	// and never forgotten: what a wait is judged against.
	answered atomic.Int64
	// awaiting counts the calls sent that have no first byte yet, and
	// awaitingSince is when that count last went from none to one.
	awaiting      atomic.Int64
	awaitingSince atomic.Int64
	state         atomic.Int32
	openUntil     atomic.Int64 // unix ns: open until then, then half-open
	trial         atomic.Bool  // a half-open trial call is out

	failures atomic.Int32 // consecutive; written under mu, read without it
	// broken counts answers cut or stalled after their first byte, in a
	// row: each such call closed the failures streak when it answered.
	broken atomic.Int32
	// unproven: back from its last ejection, no answer of a call sent
	// since has completed. An answer it breaks then is a failed trial:
	// judged at its first byte, the trial closed the breaker, and a
	// replica that cut every stream after a few events was ejected for
	// eject_for again and again, never longer.
	unproven atomic.Bool
	// oneAtATime: back from its last ejection, no answer of a call sent
	// since has completed, of any kind. It takes one call at a time
	// meanwhile (pick). Apart from unproven, which only an answer of the
	// kind that broke clears: a replica ejected for cutting streams, then
	// sent only non-streamed calls, would have stayed at one call at a
	// time for as long.
	oneAtATime atomic.Bool
	// brokenKinds are the kinds of answer (kindStream, kindWhole) it broke
	// since one of that kind last completed. Only an answer of each kind
	// ends the broken streak and proves it back: a replica that cut every
	// stream but answered non-streamed calls whole, under mixed traffic,
	// had its streak reset by those answers and was ejected for eject_for
	// now and then, or never, however many streams it cut. Written under
	// mu.
	brokenKinds atomic.Uint32
	mu          sync.Mutex // breaker transitions; never held across I/O
	// ejectFor is how long the last ejection was: a failed trial (or an
	// answer broken while unproven) ejects for twice as long.
	ejectFor  time.Duration
	lastError string // for operators (the admin API, the log): with addresses
	// clientError is lastError in words a client may read (503s name why
	// an upstream is out): no address, host name or DNS server.
	clientError string
	probing     bool
	// trialFailed: a trial call failed since the breaker last closed; the
	// probe's answer then no longer ends an ejection (its upstream answers
	// GET /models but not calls). Written under mu.
	trialFailed atomic.Bool
	// resting: out because it answered 429 with Retry-After, not because
	// it failed; written under mu.
	resting atomic.Bool

	// Calls and failures in the current and the previous minute, for the
	// error rate the admin API shows.
	window   atomic.Int64 // unix minute of cur
	curCalls atomic.Int64
	curFails atomic.Int64
	prvCalls atomic.Int64
	prvFails atomic.Int64

	calls     atomic.Uint64 // attempts that got an answer or failed, ever
	ejections atomic.Uint64
	retries   atomic.Uint64 // calls moved away from this upstream
	// busy counts attempts not sent because its max_connections
	// connections stayed in use for first_byte_timeout: the gateway's cap
	// full, not the upstream failing.
	busy atomic.Uint64
	// usageRefused counts calls whose usage report it sent was not
	// believed (usage.go, believedUsage): the log says only some.
	usageRefused atomic.Uint64
	// overruns counts answers it followed with bytes nobody asked for
	// (upstream.answerOverran).
	overruns atomic.Uint64
	// failing counts its calls in a row that failed, before their first
	// byte or after it (broken), those of a pool it serves alone too,
	// which failures and broken leave out (it is never ejected): read by
	// the admin API and tollgate_upstream_healthy, which said a model's
	// only upstream was healthy while every call to it failed. An answer
	// ends it when it completes, not at its first byte (endFailingStreak):
	// ended there, an upstream that cut every stream after its first
	// event showed healthy.
	failing atomic.Int64
}

// carryFrom takes over what prev, the health of the same upstream under
// its previous settings, had learned. The counters always carry: they are
// the upstream's history, and /metrics must not see them fall to 0 at an
// edit of idle_timeout. So do the calls in flight, whose count both share:
// those still running under prev end on it, and with a count of its own
// an upstream edited under load read as idle to least_in_flight and p2c,
// in the admin API and tollgate_upstream_in_flight, until they ended. The
// breaker and the latency carry only when the
// address is the same: they describe that server, and an ejected upstream
// must not come back because its weight was edited. A half-open trial in
// flight stays prev's; this health starts open again and tries anew.
func (h *upstreamHealth) carryFrom(prev *upstreamHealth, sameServer bool) {
	h.inflight = prev.inflight
	h.calls.Store(prev.calls.Load())
	h.ejections.Store(prev.ejections.Load())
	h.retries.Store(prev.retries.Load())
	h.busy.Store(prev.busy.Load())
	h.usageRefused.Store(prev.usageRefused.Load())
	h.overruns.Store(prev.overruns.Load())
	h.window.Store(prev.window.Load())
	h.curCalls.Store(prev.curCalls.Load())
	h.curFails.Store(prev.curFails.Load())
	h.prvCalls.Store(prev.prvCalls.Load())
	h.prvFails.Store(prev.prvFails.Load())
	if !sameServer {
		return
	}
	h.latency.Store(prev.latency.Load())
	h.failing.Store(prev.failing.Load())
	h.sampled.Store(prev.sampled.Load())
	h.answered.Store(prev.answered.Load())
	prev.mu.Lock()
	defer prev.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	state := prev.state.Load()
	if state == stateHalfOpen {
		state = stateOpen
	}
	h.state.Store(state)
	h.openUntil.Store(prev.openUntil.Load())
	h.failures.Store(prev.failures.Load())
	h.broken.Store(prev.broken.Load())
	h.unproven.Store(prev.unproven.Load())
	h.oneAtATime.Store(prev.oneAtATime.Load())
	h.brokenKinds.Store(prev.brokenKinds.Load())
	h.resting.Store(prev.resting.Load())
	h.ejectFor, h.lastError, h.clientError = prev.ejectFor, prev.lastError, prev.clientError
}

// initialLatency stands in for an upstream's latency until it answered.
const initialLatency = int64(time.Millisecond)

// A ticket is what a call's failure is judged by: when the call was sent,
// as the upstream's ejections so far, and whether it was the half-open
// trial. Every call that was in flight when an upstream was ejected fails
// after the ejection: judged by the state at its failure, each was one
// more ejection, twice as long as the last (24 calls held by a replica
// that answered 500 for 100 ms ejected it 21 times, for 30 s, with
// trialFailed set so that its probe gave up).
type ticket struct {
	ejections uint64
	trial     bool
}

// take reports whether a call may go to the upstream now, and takes the
// half-open trial slot when the call is that trial; the ticket is what
// its outcome is reported with.
func (h *upstreamHealth) take(now int64) (ticket, bool) {
	// Read before the state: a call that saw the breaker closed just as it
	// opened holds the ejections before, and its failure only counts.
	t := ticket{ejections: h.ejections.Load()}
	switch h.state.Load() {
	case stateClosed:
		return t, true
	case stateOpen:
		if now < h.openUntil.Load() {
			return t, false
		}
		if h.resting.Load() {
			// A rest it asked for is over: nothing failed, so no trial.
			h.close()
			return t, true
		}
		h.state.CompareAndSwap(stateOpen, stateHalfOpen)
		fallthrough
	default:
		t.trial = true
		return t, h.trial.CompareAndSwap(false, true)
	}
}

// failingNow says its last eject_after calls failed or broke their
// answers: an upstream with others in its pools is ejected then, a
// model's only one is still asked.
func (h *upstreamHealth) failingNow(rt *config.Routing) bool {
	return h.failing.Load() >= int64(max(rt.EjectAfter, 1))
}

// eligible is available without taking the trial slot: for choosing.
func (h *upstreamHealth) eligible(now int64) bool {
	switch h.state.Load() {
	case stateClosed:
		return true
	case stateOpen:
		return now >= h.openUntil.Load()
	default:
		return !h.trial.Load()
	}
}

func (h *upstreamHealth) count(failed bool) {
	minute := time.Now().Unix() / 60
	if w := h.window.Load(); w != minute && h.window.CompareAndSwap(w, minute) {
		if w == minute-1 {
			h.prvCalls.Store(h.curCalls.Swap(0))
			h.prvFails.Store(h.curFails.Swap(0))
		} else {
			h.prvCalls.Store(0)
			h.prvFails.Store(0)
			h.curCalls.Store(0)
			h.curFails.Store(0)
		}
	}
	h.calls.Add(1)
	h.curCalls.Add(1)
	if failed {
		h.curFails.Add(1)
	}
}

// recent is the calls and failures of this minute and the one before, as
// of now: the window moves only when a call is counted, so an upstream
// that had no call since still held its old minutes, a 100 % error rate
// long after its last failure.
func (h *upstreamHealth) recent(now time.Time) (calls, fails int64) {
	switch minute, w := now.Unix()/60, h.window.Load(); w {
	case minute:
		return h.curCalls.Load() + h.prvCalls.Load(), h.curFails.Load() + h.prvFails.Load()
	case minute - 1: // its current minute is now the previous one
		return h.curCalls.Load(), h.curFails.Load()
	}
	return 0, 0
}

// succeeded records an answer (any status but those failed takes), of the
// call sent with ticket sent, after ttfb; recovered says it closed the
// breaker. Only the half-open trial's answer closes it: a call sent before
// the ejection answers for the upstream as it was then, as its failure
// would only count (see failed). Any answer closed it: with a 300 ms first
// byte, a 20 s ejection ended after a few ms, at the first answer of a
// call in flight across it, which also cleared trialFailed, so the probe
// shortened the next ejection of an upstream failing its trials. It does
// not end the failing streak: the answer may still break (see
// endFailingStreak).
func (h *upstreamHealth) succeeded(sent ticket, ttfb time.Duration) (recovered bool) {
	h.count(false)
	h.sampleAnswer(ttfb)
	if old := h.answered.Load(); old == 0 {
		h.answered.Store(int64(ttfb))
	} else {
		h.answered.Store(towards(old, int64(ttfb)))
	}
	if h.state.Load() == stateClosed {
		if h.failures.Load() != 0 {
			h.mu.Lock()
			h.failures.Store(0)
			h.mu.Unlock()
		}
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resting.Load() {
		// An answer to a model it serves alone (pool.pick asks it while it
		// rests) does not end the rest it asked for: it runs until its
		// Retry-After.
		return false
	}
	if !sent.trial || sent.ejections != h.ejections.Load() || h.state.Load() == stateClosed {
		return false
	}
	h.closeLocked()
	return true
}

// endFailingStreak ends the failing streak at an answer that completed
// (completedAnswer), or that has nothing to complete: an error status
// passed on as it is (a 4xx that blames the request, attempt). Load
// first: a store on every answer writes memory every call to this
// upstream shares, though the streak is almost never on.
func (h *upstreamHealth) endFailingStreak() {
	if h.failing.Load() != 0 {
		h.failing.Store(0)
	}
}

// probeAnswered ends an ejection early because GET /models answered: the
// next call is the half-open trial. It does not close the breaker: an
// API server can answer /models while its engine fails every call, and
// closing reset the ejection to eject_for each time, so such an upstream
// failed eject_after calls every probe_interval for good. A failed trial
// ejects it for twice as long. False when there is nothing to end (it
// recovered meanwhile, or it rests after a 429 until its Retry-After).
func (h *upstreamHealth) probeAnswered() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state.Load() != stateOpen || h.resting.Load() || h.trialFailed.Load() {
		return false
	}
	h.openUntil.Store(time.Now().UnixNano())
	return true
}

// close puts the upstream back in service. It keeps ejectFor: until an
// answer completes (unproven), an answer it breaks ejects it for twice
// as long.
func (h *upstreamHealth) close() {
	h.mu.Lock()
	h.closeLocked()
	h.mu.Unlock()
}

// closeLocked is close with h.mu held.
func (h *upstreamHealth) closeLocked() {
	h.failures.Store(0)
	h.trialFailed.Store(false)
	h.resting.Store(false)
	h.state.Store(stateClosed)
	h.trial.Store(false)
}

// failed records a connect error, a first-byte timeout or a 5xx of the
// call sent with ticket sent. It returns true when this failure ejected
// the upstream, so the caller can log it and start probing. While the
// breaker is closed, eject_after failures in a row eject it for
// eject_for; a failed half-open trial ejects it for twice as long as last
// time, up to eject_max. Any other failure is only counted and shown: a
// call sent before the last ejection (that ejection took its burst into
// account), or one that was in flight while the upstream was out. One
// alone in the call's pool is never ejected (see upstream.fail).
func (h *upstreamHealth) failed(rt *config.Routing, reason, clientReason string, sent ticket, alone, tookCall bool) (ejected bool) {
	h.count(true)
	h.failing.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastError, h.clientError = reason, clientReason
	if alone || sent.ejections != h.ejections.Load() {
		return false
	}
	switch h.state.Load() {
	case stateClosed:
		if int(h.failures.Add(1)) < rt.EjectAfter {
			return false
		}
		h.ejectLocked(rt.EjectFor)
	case stateHalfOpen:
		if !sent.trial {
			return false
		}
		// A trial the upstream took and failed (a 5xx, or no answer in
		// time) stops the probe's answer from ending the ejection early:
		// its API server answers while its calls fail. Left running after
		// a timeout, the probe brought a replica whose engine was stuck
		// back every probe_interval, for a trial that held a call for
		// response_timeout, never ejected longer. One that could not
		// connect leaves the probe running, to bring a restarted replica
		// back within a probe_interval.
		if tookCall {
			h.trialFailed.Store(true)
		}
		h.ejectLocked(min(max(2*h.ejectFor, rt.EjectFor), rt.EjectMax))
	default:
		return false
	}
	return true
}

// undecided ends an attempt sent with ticket sent that neither failed nor
// succeeded (its client left, or it answered 429 without Retry-After):
// a half-open trial frees its slot for the next call, which decides. Kept,
// the slot left the upstream half-open with no call let through, for good.
func (h *upstreamHealth) undecided(sent ticket) {
	if !sent.trial {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state.Load() == stateHalfOpen && h.ejections.Load() == sent.ejections {
		h.trial.Store(false)
	}
}

// Kinds of answer, for brokenKinds: a stream of events, or a whole body.
const (
	kindStream uint32 = 1 << iota
	kindWhole
)

// answerKind is the kind of an answer that was a stream or not.
func answerKind(streamed bool) uint32 {
	if streamed {
		return kindStream
	}
	return kindWhole
}

// brokeMidAnswer records an answer, of the call sent with ticket sent,
// that the upstream cut or stalled after its first byte (a reset
// connection, idle_timeout, a body shorter than announced) or ended with
// its own error; streamed says whether it was a stream. The call was
// counted when it answered, and its answer ended the failures streak, so
// these have a streak of their own: eject_after of them with no answer
// of each kind that broke completed in between (see brokenKinds) eject
// the upstream, as failures before the first byte do. A replica that
// crashes or hangs while generating would otherwise keep its share of
// calls for good. Back from an ejection with no answer completed since
// (unproven), the first it breaks is a failed trial: it ejects the
// upstream at once for twice as long as last time, up to eject_max, and,
// as for a trial failed with an answer, the probe no longer ends that
// early (its server answered). A call sent before the last ejection only
// counts, as for failed. alone as for failed.
func (h *upstreamHealth) brokeMidAnswer(rt *config.Routing, reason, clientReason string, sent ticket, alone, streamed bool) (ejected bool) {
	h.curFails.Add(1) // the call itself was counted when it answered
	h.failing.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastError, h.clientError = reason, clientReason
	if alone || sent.ejections != h.ejections.Load() || h.state.Load() != stateClosed {
		return false
	}
	h.brokenKinds.Or(answerKind(streamed))
	if h.unproven.Load() {
		h.broken.Store(0)
		h.trialFailed.Store(true)
		h.ejectLocked(min(max(2*h.ejectFor, rt.EjectFor), rt.EjectMax))
		return true
	}
	if broken := h.broken.Add(1); int(broken) < rt.EjectAfter {
		return false
	}
	h.broken.Store(0)
	h.ejectLocked(rt.EjectFor)
	return true
}

// completedAnswer records an answer, of the call sent with ticket sent,
// relayed whole; streamed says whether it was a stream. It ends the
// streak of broken answers and, sent since the last ejection, proves the
// upstream back (a call sent before proves nothing of how it is now) —
// unless answers of another kind broke since one of theirs completed: a
// non-streamed answer proves nothing of the streams an upstream cuts, nor
// a stream of the bodies it cuts short. An ejection keeps brokenKinds, so
// after its return only an answer of the kind that broke proves it.
// Any answer completed ends the failing streak, of either kind and sent
// whenever: that streak is the last calls', for operators.
func (h *upstreamHealth) completedAnswer(sent ticket, streamed bool) {
	h.endFailingStreak()
	if !h.oneAtATime.Load() && h.brokenKinds.Load() == 0 && !h.unproven.Load() {
		if h.broken.Load() != 0 {
			h.broken.Store(0)
		}
		return // in service all along: nothing to prove, no lock
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Not across an ejection: a call sent before it proves nothing.
	current := sent.ejections == h.ejections.Load()
	if current {
		h.oneAtATime.Store(false)
	}
	if broke := h.brokenKinds.Load(); broke != 0 {
		kind := answerKind(streamed)
		if broke&^kind != 0 || !current {
			return
		}
		h.brokenKinds.And(^kind)
	}
	h.broken.Store(0)
	if current {
		h.unproven.Store(false)
	}
}

// ejectLocked opens the breaker for d. The ejections count goes up before
// the state changes: a call that saw the breaker closed holds a ticket
// from before this ejection, or finds it open when it fails. h.mu is held.
func (h *upstreamHealth) ejectLocked(d time.Duration) {
	h.ejectFor = d
	h.unproven.Store(true)
	h.oneAtATime.Store(true)
	h.openUntil.Store(time.Now().Add(d).UnixNano())
	h.ejections.Add(1)
	h.state.Store(stateOpen)
	h.resting.Store(false)
	h.trial.Store(false)
}

// rest takes the upstream out for d without counting a failure: it
// answered 429 with Retry-After.
func (h *upstreamHealth) rest(d time.Duration, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastError, h.clientError = reason, reason
	until := time.Now().Add(d).UnixNano()
	if h.state.Load() == stateOpen && h.openUntil.Load() >= until {
		return
	}
	h.resting.Store(true)
	h.openUntil.Store(until)
	h.state.Store(stateOpen)
	h.trial.Store(false)
}

// describe says why an upstream is out, for the 503 when all are.
func (h *upstreamHealth) describe(now int64) string {
	h.mu.Lock()
	reason, resting := h.clientError, h.resting.Load()
	h.mu.Unlock()
	switch h.state.Load() {
	case stateOpen:
		left := time.Duration(h.openUntil.Load() - now).Round(time.Millisecond)
		if resting {
			return fmt.Sprintf("resting for %s more (%s)", max(left, 0), reason)
		}
		return fmt.Sprintf("ejected for %s more (%s)", max(left, 0), reason)
	case stateHalfOpen:
		return fmt.Sprintf("being retried (%s)", reason)
	}
	return "serving"
}

// pool is one model's upstreams with their weights. It is built with the
// World; the upstreams (and their health) may outlive it.
type pool struct {
	members []poolMember
	weights int
	rr      atomic.Uint64
}

type poolMember struct {
	up     *upstream
	weight int
}

func newPool(members []config.PoolMember, upstreams map[string]*upstream) *pool {
	p := &pool{}
	for _, m := range members {
		if up := upstreams[m.Name]; up != nil {
			p.members = append(p.members, poolMember{up, max(m.Weight, 1)})
			p.weights += max(m.Weight, 1)
		}
	}
	return p
}

// pick chooses the upstream for the next attempt of a call, never one of
// the members in tried (by index), which earlier attempts used. affinity, when not 0, keeps calls with the
// same key on the same member while it is available. nil means every
// member is ejected. The call is counted as waiting on the upstream
// returned (await): the caller takes it back (awaiting.Add(-1)) when the
// first byte came or the attempt failed. Counted by the caller after
// pick returned, concurrent picks all saw a replica that never answered
// free, and each sent it a call (slow start let 2 to 3 of 8 clients
// through to one stopped before its first answer). The ticket goes with
// the attempt's failure (see upstreamHealth.failed).
func (p *pool) pick(rt *config.Routing, tried uint64, affinity uint64) (*upstream, int, ticket) {
	now := time.Now().UnixNano()
	if len(p.members) == 1 {
		// A model's only upstream is always asked: out for failures or
		// resting after a 429, it would leave the model nothing to answer
		// with, and one caller's failing or oversized requests would
		// refuse every other caller (see upstream.fail). Its answers,
		// 429s with their Retry-After included, reach each caller as given.
		if tried == 0 {
			p.members[0].up.health.await(now)
			return p.members[0].up, 0, ticket{} // alone: its failures only count
		}
		return nil, -1, ticket{}
	}
	// One call at a time: a member that never answered (slow start, p2c)
	// until it answers, and one back from an ejection with no answer
	// completed since (unproven, any balance) until one completes. Those
	// holding their call are left out of the choice, unless every member
	// left holds one (all new, their first calls out, or the others out):
	// the call goes to one of them rather than nowhere. lost are those
	// whose one call a concurrent pick took between choosing and taking.
	slowStart := rt.Balance != "round_robin" && rt.Balance != "least_in_flight"
	var lost uint64
	if affinity != 0 {
		// A key stays on a new member (its cache is what affinity is
		// for), not on one back from an ejection whose answer is out.
		skip := tried
		if held, every := p.holdingTheirCall(now, tried, lost, false); !every {
			skip |= held
		}
		if i := p.rendezvous(affinity, now, skip); i >= 0 {
			if t, ok := p.members[i].up.health.send(now); ok {
				return p.members[i].up, i, t
			}
		}
	}
	// Up to three passes: a chosen member may lose its half-open slot to
	// a concurrent call between choosing and taking. A lost one-call slot
	// costs no pass: each adds a member to lost.
	for passes := 0; passes < 3; {
		skip, alone := tried, false
		if held, every := p.holdingTheirCall(now, tried, lost, slowStart); !every {
			skip, alone = tried|held, true
		}
		i := p.choose(rt.Balance, now, skip)
		if i < 0 {
			return nil, -1, ticket{}
		}
		h := &p.members[i].up.health
		t, ok := h.take(now)
		if !ok {
			passes++
			continue
		}
		if alone && h.oneCallAtATime(slowStart) {
			if !h.awaitAlone(now) {
				lost |= 1 << i
				continue
			}
		} else {
			h.await(now)
		}
		return p.members[i].up, i, t
	}
	return nil, -1, ticket{}
}

// takeMember takes up, a member of p, for an attempt as pick does (counted
// as awaiting): its index and ticket, or -1 when it is not in p or not
// available now.
func (p *pool) takeMember(up *upstream) (int, ticket) {
	for i, m := range p.members {
		if m.up != up {
			continue
		}
		t, ok := up.health.send(time.Now().UnixNano())
		if !ok {
			return -1, ticket{}
		}
		return i, t
	}
	return -1, ticket{}
}

// holdingTheirCall is the members outside skip that take one call at a
// time and hold it (and those in lost), and whether they are every
// eligible member outside skip.
func (p *pool) holdingTheirCall(now int64, skip, lost uint64, slowStart bool) (held uint64, every bool) {
	every = true
	for i, m := range p.members {
		if skip&(1<<i) != 0 || !m.up.health.eligible(now) {
			continue
		}
		if lost&(1<<i) != 0 || m.up.health.holdsItsOneCall(slowStart) {
			held |= 1 << i
		} else {
			every = false
		}
	}
	return held, every
}

// oneCallAtATime reports whether the upstream, in service, takes one call
// at a time: it never answered a call (slow start, when slowStart), or
// it is back from an ejection and no answer of a call sent since
// completed (oneAtATime). Judged at its first byte, a replica back from an
// ejection that stalled after it took its full share of calls until the
// trial's idle_timeout ran out, a minute at the default: 4 to 5 streams
// of 8 clients hung on it each time it returned.
func (h *upstreamHealth) oneCallAtATime(slowStart bool) bool {
	return h.state.Load() == stateClosed && (h.oneAtATime.Load() || slowStart && h.answered.Load() == 0)
}

// holdsItsOneCall reports whether the upstream takes one call at a time
// and has it: a call waiting for its first byte, or, back from an
// ejection (oneAtATime), any call in flight (its answer is what ends that). A call is counted awaiting
// from its pick and in flight before its first byte, so concurrent picks
// never see it free between the two.
func (h *upstreamHealth) holdsItsOneCall(slowStart bool) bool {
	if !h.oneCallAtATime(slowStart) {
		return false
	}
	if h.awaiting.Load() > 0 {
		return true
	}
	return h.oneAtATime.Load() && h.inflight.Load() > 0
}

// send is take and, when the call may go, await: for a call sent to this
// upstream by name (pinned, preferred, affinity) rather than drawn.
func (h *upstreamHealth) send(now int64) (ticket, bool) {
	t, ok := h.take(now)
	if ok {
		h.await(now)
	}
	return t, ok
}

// await counts a call sent to the upstream that waits for its first byte.
func (h *upstreamHealth) await(now int64) {
	if h.awaiting.Add(1) == 1 {
		h.awaitingSince.Store(now)
	}
}

// awaitAlone is await for a call that must be the only one waiting (slow
// start): false, counting nothing, when another waits already.
func (h *upstreamHealth) awaitAlone(now int64) bool {
	if !h.awaiting.CompareAndSwap(0, 1) {
		return false
	}
	h.awaitingSince.Store(now)
	return true
}

// another reports whether a member outside tried could take a retry.
func (p *pool) another(tried uint64) bool {
	now := time.Now().UnixNano()
	for i, m := range p.members {
		if tried&(1<<i) == 0 && m.up.health.eligible(now) {
			return true
		}
	}
	return false
}

// turn is the member whose turn it is in a weighted round: turn t of
// the pool's total weight goes to the member whose slice of it holds t.
func (p *pool) turn() int {
	t := int(p.rr.Add(1) % uint64(p.weights))
	i := 0
	for t >= p.members[i].weight {
		t -= p.members[i].weight
		i++
	}
	return i
}

func (p *pool) choose(mode string, now int64, skip uint64) int {
	switch mode {
	case "round_robin":
		n := len(p.members)
		start := p.turn()
		for k := range n {
			i := (start + k) % n
			if skip&(1<<i) == 0 && p.members[i].up.health.eligible(now) {
				return i
			}
		}
		return -1
	case "least_in_flight":
		// Calls in flight per unit of weight, compared as fractions; among
		// members tied for the fewest, the one whose turn it is (as
		// round_robin) or the next, as nginx's least_conn does. With the
		// first member always winning a tie, and a call in flight counted
		// once more, calls that did not overlap all went to the first
		// member (equal weights) or the heaviest.
		n := len(p.members)
		start := p.turn()
		best, bestInflight, bestWeight := -1, int64(0), int64(1)
		for k := range n {
			i := (start + k) % n
			m := p.members[i]
			if skip&(1<<i) != 0 || !m.up.health.eligible(now) {
				continue
			}
			inflight, weight := m.up.health.inflight.Load(), int64(m.weight)
			if best < 0 || inflight*bestWeight < bestInflight*weight {
				best, bestInflight, bestWeight = i, inflight, weight
			}
		}
		return best
	}
	// Power of two choices: two members drawn by weight, the one with less
	// work queued (in flight per unit of weight, plus one, x latency: see
	// cost) wins. At idle the weight is in the draw only: divided into the
	// whole cost as well, it counted twice, and a member of weight 2
	// beside two of weight 1 took 80 % of the calls at idle.
	// A bigger replica's speed is in its latency already. Costs within
	// a quarter of each other, or a millisecond (clearlyCheaper), are a
	// tie, won by the first drawn, so ties share by weight: compared
	// strictly, the member measured fastest by a fraction of a
	// millisecond of noise won every pairing it was in, and a member of
	// weight 2 beside two of weight 1 got 59-79 % of one client's calls,
	// not 50 %.
	a := p.draw(now, skip, -1)
	if a < 0 {
		return -1
	}
	b := p.draw(now, skip, a)
	if b < 0 || !clearlyCheaper(p.cost(b, now), p.cost(a, now)) {
		return a
	}
	return b
}

// clearlyCheaper reports whether cost x is more than a fifth below y (y
// over 1.25 times x) and more than tieFloor below it: what p2c takes as a
// real difference, not noise. Costs are at most math.MaxInt64/2, so
// nothing overflows.
func clearlyCheaper(x, y int64) bool { return x < y-max(y/5, tieFloor) }

// tieFloor is the least difference of cost p2c takes as real. A quarter
// alone is a few hundred microseconds at sub-millisecond answers, where
// one first byte delayed a few milliseconds by the host (a GC pause, the
// scheduler of a busy machine) moved a member's average past it, and the
// member lost every pairing until its average was halved, a second later:
// three like members answering in 1 ms got 7, 690 and 803 of 1,500
// calls. A millisecond is above that noise and below what an LLM's first
// byte takes (tens of milliseconds at least, where the quarter is the
// wider band); at sub-millisecond answers it ties one call in flight
// more, which is not load there.
const tieFloor = int64(time.Millisecond)

// latencyHalfLife is how fast an upstream's latency, unsampled, is
// forgotten. A latency is measured only on calls the upstream gets, so
// without forgetting, a replica that was slow once (its first, cold
// calls) lost every pairing at light load and was never measured again;
// halved each second, it gets a call back within seconds, and that call
// measures it anew. Linkerd's peak-EWMA balancer decays the same way.
const latencyHalfLife = time.Second

// Only an idle upstream's latency is forgotten. One with calls waiting for
// a first byte, and none for longer than its average, may be hung: it
// costs at least that wait (calls still streaming do not count: a
// replica relaying long answers is busy, not hung). Forgetting its latency made its cost fall to nothing however
// many calls it held, and a replica fast before it stopped won every
// pairing on its old average: p2c sent it every call (8 of 8 clients
// stuck on a stopped replica within 3 s).
func (p *pool) cost(i int, now int64) int64 {
	h := &p.members[i].up.health
	if h.state.Load() != stateClosed {
		// Due its trial (only eligible members are drawn): it wins the
		// pairing. Priced as usual, one that never answered cost a fixed
		// initialLatency and lost every pairing to faster peers, so its
		// trial never came and, repaired, it never returned.
		return 0
	}
	lat := h.latency.Load()
	inflight := h.inflight.Load()
	switch {
	case inflight == 0 && lat != 0:
		lat = decayed(lat, now-h.sampled.Load())
	case h.awaiting.Load() > 0:
		if h.answered.Load() == 0 {
			// Never answered, and a call waits on it: it takes no other
			// until it answers (slow start; pick leaves it out of the draw
			// unless every member is so). Priced by its wait, a replica
			// stopped before its first answer still drew most clients in
			// its first second, when every wait is short.
			return math.MaxInt64 / 2
		}
		lat = max(lat, now-max(h.sampled.Load(), h.awaitingSince.Load()))
	case lat == 0:
		lat = initialLatency
	}
	// The calls in flight count per unit of weight, the one to come in
	// full: at idle the weight stays in the draw alone (see pick), and
	// under load a member of weight 2 carrying twice the calls of its
	// like peers ties with them. Counted whole, its calls made it lose
	// those pairings, and such a member got 36 % of the calls, not 50 %.
	w := int64(max(p.members[i].weight, 1))
	return (inflight + w) * lat / w
}

// held records a call whose client left before the upstream answered: its
// wait is a first byte's time at the least, blended in as one. Left out, a
// stopped replica whose every call outlasted its client's timeout looked
// idle and fast, kept winning pairings and was never ejected. It reports
// whether the wait was far past the upstream's average answer (four
// times it, and a second at least): a failure to answer, not a slow
// answer. Judged against the average with the waits blended in, the
// clients that gave up on a stopped replica at one moment counted as one
// failure: the first one's wait raised the bar past the others'.
func (h *upstreamHealth) held(wait time.Duration) (failed bool) {
	h.sample(wait)
	typical := max(h.answered.Load(), initialLatency) // one that never answered yet too
	return wait > max(4*time.Duration(typical), time.Second)
}

// sample blends a time to the first byte into the latency average as cost
// sees it, forgotten since the last sample: blended into the stored one,
// each new sample of a replica slow once brought the old penalty back, and
// it took dozens of calls, one every few seconds, to win its share again
// (6 calls of 10,000 over 22 s after a 2 s pause).
func (h *upstreamHealth) sample(d time.Duration) {
	now := time.Now().UnixNano()
	if stored := h.latency.Load(); stored == 0 {
		h.latency.Store(int64(d))
	} else {
		h.latency.Store(towards(decayed(stored, now-h.sampled.Load()), int64(d)))
	}
	h.sampled.Store(now)
}

// sampleAnswer is sample for an answer's first byte, which counts for at
// most spikeBound times the average as last measured: one first byte the
// host delayed (a GC pause, a busy scheduler) moved a 1 ms member's
// average to 4.4 ms, and p2c gave it no call, so no sample, until it was
// halved a second later. A member really slower reaches its new average
// within a few samples, and loses pairings from the first or second; one
// that stops answering is priced by its wait, and a wait its client gave
// up on (held) is sampled whole.
func (h *upstreamHealth) sampleAnswer(ttfb time.Duration) {
	if stored := h.latency.Load(); stored != 0 {
		ttfb = min(ttfb, time.Duration(spikeBound*stored))
	}
	h.sample(ttfb)
}

// spikeBound is how many times its average one answer's latency may
// count for (sampleAnswer).
const spikeBound = 4

// towards moves the moving average avg an eighth of the way to sample.
func towards(avg, sample int64) int64 { return avg + (sample-avg)/8 }

// decayed is a latency halved for each latencyHalfLife of age.
func decayed(lat, age int64) int64 {
	if halvings := age / int64(latencyHalfLife); halvings > 0 {
		return lat >> min(halvings, 62)
	}
	return lat
}

// draw picks an eligible member at random by weight, other than not and
// those in skip, or -1.
func (p *pool) draw(now int64, skip uint64, not int) int {
	total := 0
	for i, m := range p.members {
		if i != not && skip&(1<<i) == 0 && m.up.health.eligible(now) {
			total += m.weight
		}
	}
	if total == 0 {
		return -1
	}
	r := rand.IntN(total)
	for i, m := range p.members {
		if i != not && skip&(1<<i) == 0 && m.up.health.eligible(now) {
			if r -= m.weight; r < 0 {
				return i
			}
		}
	}
	return -1
}

// rendezvous is the member with the highest weighted hash for key among
// those eligible: a key stays on its member while that member serves, and
// moves only when it leaves.
func (p *pool) rendezvous(key uint64, now int64, skip uint64) int {
	best, bestScore := -1, 0.0
	for i, m := range p.members {
		if skip&(1<<i) != 0 || !m.up.health.eligible(now) {
			continue
		}
		// Weighted rendezvous hashing: weight / -ln(u), u uniform in (0, 1].
		u := (float64(mix(key^m.up.nameHash)>>11) + 1) / (1 << 53)
		score := float64(m.weight) / -math.Log(u)
		if best < 0 || score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// mix is SplitMix64's finalizer: a cheap, well-spread hash of x.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// allDown is the answer for a call none of whose upstreams is available:
// 503, or 429 when every one rests after answering 429 itself, so SDKs
// see the rate limit they would have seen from the upstream. Either way
// Retry-After says when the first one is back, if it is known.
func (p *pool) allDown(model string) *APIError {
	now := time.Now().UnixNano()
	parts := make([]string, 0, len(p.members))
	back, resting := int64(0), true
	for _, m := range p.members {
		h := &m.up.health
		parts = append(parts, m.up.cfg.Name+": "+h.describe(now))
		resting = resting && h.resting.Load()
		if h.state.Load() == stateOpen {
			if until := h.openUntil.Load(); until > now && (back == 0 || until < back) {
				back = until
			}
		} else {
			back = -1 // a half-open trial is out: its answer decides
		}
	}
	e := Unavailable(fmt.Sprintf("every upstream of model %q is unavailable (%s)", model, strings.Join(parts, "; ")))
	if resting && back > 0 {
		e = &APIError{Status: 429, Type: "rate_limit_error", Code: "rate_limit_exceeded",
			Message: fmt.Sprintf("every upstream of model %q is rate limited (%s)", model, strings.Join(parts, "; "))}
	}
	if back > 0 {
		e.RetryAfter = time.Duration(back - now)
	}
	return e
}

// affinityHash hashes affinity keys and upstream names with a fixed
// function, not a per-process seed, so every gateway of a deployment, and a
// restarted one, sends a session to the same upstream.
func affinityHash(b []byte) uint64 { return xxhash.Sum64(b) | 1 }

// affinityKey is the key calls of one session share, or 0: the header's
// value, or a hash of the first bytes of the messages or input.
func affinityKey(rt *config.Routing, ctx *fasthttp.RequestCtx, body []byte) uint64 {
	switch rt.Affinity {
	case "header":
		if v := ctx.Request.Header.Peek(rt.AffinityHeader); len(v) > 0 {
			return affinityHash(v)
		}
	case "prefix":
		start := prefixStart(body)
		if start < 0 {
			return 0
		}
		end := min(len(body), start+int(rt.AffinityPrefixBytes))
		return affinityHash(body[start:end])
	}
	return 0
}

// prefixStart is the offset in body of the messages (chat) or input
// (responses) value, or -1.
func prefixStart(body []byte) int {
	for _, key := range [...]string{"messages", "input"} {
		if r := gjson.GetBytes(body, key); r.Exists() && r.Index > 0 {
			return r.Index
		}
	}
	return -1
}

// UpstreamStatus is one upstream as GET /admin/v1/upstreams shows it.
type UpstreamStatus struct {
	Name    string   `json:"name"`
	BaseURL string   `json:"base_url"`
	Models  []string `json:"models"`
	// State is "healthy", "ejected" (failed; out until EjectedUntil),
	// "resting" (answered 429 with Retry-After; out until EjectedUntil, no
	// failure counted), "half_open" (the next call is a trial) or
	// "failing" (its last eject_after calls or more failed, before their
	// first byte or after it, and it is not out: the only upstream of a
	// model it serves, never ejected).
	State        string     `json:"state"`
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
	InFlight     int64      `json:"in_flight"`
	LatencyMs    float64    `json:"latency_ms"` // moving average of the time to the answer's first byte
	// Calls and failed calls in the current and the previous minute.
	RecentCalls     int64   `json:"recent_calls"`
	RecentErrorRate float64 `json:"recent_error_rate"`
	Calls           uint64  `json:"calls"` // since the gateway started
	Ejections       uint64  `json:"ejections"`
	Retries         uint64  `json:"retries"` // calls that moved on from it
}

// UpstreamStatuses reports every configured upstream, in config order.
func (w *World) UpstreamStatuses() []UpstreamStatus {
	models := map[string][]string{}
	for _, e := range w.Catalog.Entries() {
		for _, m := range e.Pool {
			models[m.Name] = append(models[m.Name], e.ID)
		}
	}
	now := time.Now()
	out := make([]UpstreamStatus, 0, len(w.Config.Upstreams))
	for _, uc := range w.Config.Upstreams {
		up := w.upstreams[uc.Name]
		if up == nil {
			continue
		}
		h := &up.health
		st := UpstreamStatus{Name: uc.Name, BaseURL: uc.BaseURL, Models: models[uc.Name], State: "healthy",
			InFlight: h.inflight.Load(), LatencyMs: float64(h.latency.Load()) / 1e6,
			Calls: h.calls.Load(), Ejections: h.ejections.Load(), Retries: h.retries.Load()}
		if st.Models == nil {
			st.Models = []string{}
		}
		h.mu.Lock()
		lastError, resting := h.lastError, h.resting.Load()
		h.mu.Unlock()
		st.LastError = lastError
		switch h.state.Load() {
		case stateOpen:
			until := time.Unix(0, h.openUntil.Load())
			// Shown UTC, to the millisecond rounded up (it is out until
			// then): it carried nanoseconds and the machine's zone. Not
			// whole seconds, as the admin API's other times: an
			// ejection may last under one.
			shown := until.UTC().Add(time.Millisecond - 1).Truncate(time.Millisecond)
			switch {
			case !until.After(now) && resting:
				// Its rest is over; the next call closes the breaker.
			case !until.After(now):
				st.State = "half_open"
			case resting:
				st.State, st.EjectedUntil = "resting", &shown
			default:
				st.State, st.EjectedUntil = "ejected", &shown
			}
		case stateHalfOpen:
			st.State = "half_open"
		default:
			if h.failingNow(&w.Config.Routing) {
				st.State = "failing"
			}
		}
		calls, fails := h.recent(time.Now())
		st.RecentCalls = calls
		if calls > 0 {
			st.RecentErrorRate = float64(fails) / float64(calls)
		}
		out = append(out, st)
	}
	return out
}

// UpstreamMetrics appends the upstreams' Prometheus series to b.
func (w *World) UpstreamMetrics(b []byte) []byte {
	type series struct {
		name, help, kind string
		value            func(h *upstreamHealth) float64
	}
	all := []series{
		{"tollgate_upstream_in_flight", "Generation calls in flight per upstream.", "gauge", func(h *upstreamHealth) float64 { return float64(h.inflight.Load()) }},
		{"tollgate_upstream_healthy", "1 while the upstream takes calls (or is due a trial call), 0 while ejected or resting, or while its last eject_after calls or more failed or broke their answers (a model's only upstream, never ejected).", "gauge", func(h *upstreamHealth) float64 {
			if h.eligible(time.Now().UnixNano()) && !h.failingNow(&w.Config.Routing) {
				return 1
			}
			return 0
		}},
		{"tollgate_upstream_latency_seconds", "Moving average of the time to the first byte of an answer's body.", "gauge", func(h *upstreamHealth) float64 { return float64(h.latency.Load()) / 1e9 }},
		{"tollgate_upstream_calls_total", "Attempts sent to the upstream that were answered or failed.", "counter", func(h *upstreamHealth) float64 { return float64(h.calls.Load()) }},
		{"tollgate_upstream_ejections_total", "Times the upstream was ejected.", "counter", func(h *upstreamHealth) float64 { return float64(h.ejections.Load()) }},
		{"tollgate_upstream_retries_total", "Calls that moved on from the upstream to another.", "counter", func(h *upstreamHealth) float64 { return float64(h.retries.Load()) }},
		{"tollgate_upstream_busy_total", "Attempts not sent because every one of the upstream's max_connections connections stayed in use for first_byte_timeout.", "counter", func(h *upstreamHealth) float64 { return float64(h.busy.Load()) }},
		{"tollgate_upstream_usage_refused_total", "Calls whose usage report from the upstream was not believed (not both counts as numbers, or a count out of range), billed on a report in range or the tokenizer's estimate instead.", "counter", func(h *upstreamHealth) float64 { return float64(h.usageRefused.Load()) }},
		{"tollgate_upstream_overruns_total", "Answers the upstream followed with bytes nobody asked for (a second response, more after a chunked body's end); their connection was closed, not reused.", "counter", func(h *upstreamHealth) float64 { return float64(h.overruns.Load()) }},
	}
	for _, s := range all {
		b = fmt.Appendf(b, "# HELP %s %s\n# TYPE %s %s\n", s.name, s.help, s.name, s.kind)
		for _, uc := range w.Config.Upstreams {
			if up := w.upstreams[uc.Name]; up != nil {
				b = fmt.Appendf(b, "%s{upstream=%s} %g\n", s.name, promLabel(uc.Name), s.value(&up.health))
			}
		}
	}
	return b
}
