package proxy

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/config"
)

func testRouting(balance string) *config.Routing {
	return &config.Routing{Balance: balance, Retries: 2, RetryBudget: 10 * time.Second,
		EjectAfter: 2, EjectFor: 50 * time.Millisecond, EjectMax: 200 * time.Millisecond, ProbeInterval: time.Second}
}

// sentNow is the ticket of a call sent now that is no half-open trial.
func sentNow(h *upstreamHealth) ticket { return ticket{ejections: h.ejections.Load()} }

func testModelPool(t testing.TB, n int) *pool {
	weights := make([]int, n)
	for i := range weights {
		weights[i] = 1
	}
	return testWeightedPool(t, weights...)
}

// testWeightedPool is a pool of upstreams u0, u1, … with these weights.
func testWeightedPool(t testing.TB, weights ...int) *pool {
	ups := map[string]*upstream{}
	var members []config.PoolMember
	for i, w := range weights {
		name := fmt.Sprintf("u%d", i)
		up, err := newUpstream(config.Upstream{Name: name, BaseURL: fmt.Sprintf("http://127.0.0.1:%d/v1", 9000+i),
			ConnectTimeout: time.Second, FirstByteTimeout: time.Second, IdleTimeout: time.Second, WriteTimeout: time.Second,
			MaxConnections: 8, MaxResponseBody: 1 << 20}, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		ups[name] = up
		members = append(members, config.PoolMember{Name: name, Weight: w})
	}
	return newPool(members, ups)
}

func TestBreakerEjectsHalfOpensAndCloses(t *testing.T) {
	rt := testRouting("p2c")
	p := testModelPool(t, 2)
	h := &p.members[0].up.health
	takes := func() bool { return h.available(time.Now().UnixNano()) }
	if h.failed(rt, "refused", "refused", sentNow(h), false, false) {
		t.Fatal("ejected after one failure with eject_after 2")
	}
	if !h.failed(rt, "refused", "refused", sentNow(h), false, false) {
		t.Fatal("not ejected after eject_after failures")
	}
	for range 10 {
		if up, i, _ := p.pick(rt, 0, 0); up == nil || i != 1 {
			t.Fatal("an ejected upstream was picked")
		}
	}
	// Times are read off the breaker, not slept past: a runner that
	// descheduled the test for 40 ms between a sleep and a look failed it.
	backAt := h.openUntil.Load()
	if h.available(backAt - 1) {
		t.Fatal("serving before eject_for ended")
	}
	trial, ok := h.take(backAt)
	if !ok || !trial.trial {
		t.Fatal("no trial call after eject_for")
	}
	if h.available(backAt) {
		t.Fatal("a second call went out while the half-open trial was out")
	}
	failedAt := time.Now().UnixNano()
	h.failed(rt, "refused again", "refused again", trial, false, false) // out for twice as long
	backAt = h.openUntil.Load()
	if d := time.Duration(backAt - failedAt); d < 2*rt.EjectFor {
		t.Fatalf("out for %s after a failed trial, want twice eject_for (%s)", d, 2*rt.EjectFor)
	}
	if h.available(backAt - 1) {
		t.Fatal("back before the doubled cool-down ended")
	}
	trial, ok = h.take(backAt)
	if !ok || !trial.trial {
		t.Fatal("no trial after the doubled cool-down")
	}
	h.succeeded(trial, time.Millisecond)
	for range 3 {
		if !takes() {
			t.Fatal("not serving after a successful trial")
		}
	}
}

// Calls in flight when an upstream is ejected fail after the ejection,
// and each only counts: judged by the breaker's state when it failed, each
// was another ejection twice as long as the last. 24 clients on a replica
// that answered 500 for 100 ms ejected it 21 times, for eject_max, and set
// trialFailed so that its probe gave up while it answered again. Only the
// half-open trial's failure ejects it for longer.
func TestCallsInFlightAtAnEjectionOnlyCount(t *testing.T) {
	rt := testRouting("p2c")
	rt.EjectAfter, rt.EjectFor, rt.EjectMax = 3, time.Second, 30*time.Second
	p := testModelPool(t, 2)
	h := &p.members[0].up.health
	var inFlight []ticket
	for range 24 {
		sent, ok := h.take(time.Now().UnixNano())
		if !ok || sent.trial {
			t.Fatal("a serving upstream refused a call, or took it as a trial")
		}
		inFlight = append(inFlight, sent)
	}
	ejected := 0
	for _, sent := range inFlight[:12] {
		if h.failed(rt, "answered 500", "answered 500", sent, false, true) {
			ejected++
		}
	}
	if ejected != 1 || h.ejections.Load() != 1 {
		t.Fatalf("12 calls sent at once failing ejected it %d times (ejections %d), want once", ejected, h.ejections.Load())
	}
	if h.ejectFor != rt.EjectFor || h.trialFailed.Load() {
		t.Fatalf("ejected for %s (trial failed: %v) by one burst, want eject_for %s", h.ejectFor, h.trialFailed.Load(), rt.EjectFor)
	}
	if !h.probeAnswered() {
		t.Fatal("the probe's answer did not end an ejection no trial had failed")
	}
	trial, ok := h.take(time.Now().UnixNano())
	if !ok || !trial.trial {
		t.Fatal("no trial call after the probe answered")
	}
	// More of the burst fail while the trial is out: they decide nothing.
	for _, sent := range inFlight[12:18] {
		if h.failed(rt, "refused", "refused", sent, false, false) {
			t.Fatal("a call sent before the ejection ejected it again while its trial was out")
		}
	}
	if h.state.Load() != stateHalfOpen || h.available(time.Now().UnixNano()) {
		t.Fatal("a call sent before the ejection ended the trial, or freed its slot")
	}
	h.succeeded(trial, time.Millisecond) // the trial
	// And after it is back, the rest of the burst starts no new streak.
	for _, sent := range inFlight[18:] {
		if h.failed(rt, "answered 500", "answered 500", sent, false, true) {
			t.Fatal("calls sent before the ejection ejected it again once it was back")
		}
	}
	if h.state.Load() != stateClosed || h.failures.Load() != 0 || h.ejections.Load() != 1 {
		t.Fatalf("state %d, failures %d, ejections %d after the burst, want serving, 0, 1", h.state.Load(), h.failures.Load(), h.ejections.Load())
	}
	// A new burst ejects it for eject_for again, and a failed trial
	// (only the trial) for twice as long.
	for range 3 {
		h.failed(rt, "answered 500", "answered 500", sentNow(h), false, true)
	}
	if h.ejections.Load() != 2 || h.ejectFor != rt.EjectFor {
		t.Fatalf("a new burst: ejections %d, for %s", h.ejections.Load(), h.ejectFor)
	}
	h.probeAnswered()
	trial, _ = h.take(time.Now().UnixNano())
	if !h.failed(rt, "answered 500", "answered 500", trial, false, true) || h.ejectFor != 2*rt.EjectFor || !h.trialFailed.Load() {
		t.Fatalf("a failed trial ejected it for %s (trial failed: %v), want %s", h.ejectFor, h.trialFailed.Load(), 2*rt.EjectFor)
	}
}

// An answer of a call sent before an ejection does not end it: it says
// how the upstream was when the call went out. Any answer closed the
// breaker: with a 300 ms first byte, a 20 s ejection lasted a few ms, and
// the answer cleared trialFailed, so the probe shortened the next
// ejection of an upstream failing its trials. Only the trial sent after
// the ejection closes it.
func TestAnAnswerSentBeforeAnEjectionDoesNotEndIt(t *testing.T) {
	rt := testRouting("p2c")
	rt.EjectAfter, rt.EjectFor, rt.EjectMax = 2, 20*time.Second, time.Minute
	p := testModelPool(t, 2)
	h := &p.members[0].up.health
	h.succeeded(sentNow(h), time.Millisecond)
	slow := sentNow(h) // its first byte comes after the ejection
	h.failed(rt, "answered 500", "answered 500", sentNow(h), false, true)
	if !h.failed(rt, "answered 500", "answered 500", sentNow(h), false, true) {
		t.Fatal("not ejected after eject_after failures")
	}
	if h.succeeded(slow, 300*time.Millisecond) || h.state.Load() != stateOpen || h.available(time.Now().UnixNano()) {
		t.Fatal("the answer of a call sent before the ejection ended it")
	}
	// Half-open, its trial out: only the trial's answer decides.
	h.openUntil.Store(time.Now().UnixNano())
	trial, ok := h.take(time.Now().UnixNano())
	if !ok || !trial.trial {
		t.Fatal("no trial after the ejection ran out")
	}
	if h.succeeded(slow, 300*time.Millisecond) || h.state.Load() != stateHalfOpen {
		t.Fatal("the answer of a call sent before the ejection closed the breaker while its trial was out")
	}
	// A failed trial ejects it for twice as long; a late answer of the
	// failed burst neither ends that nor lets the probe shorten it.
	if !h.failed(rt, "answered 500", "answered 500", trial, false, true) || !h.trialFailed.Load() {
		t.Fatal("a failed trial did not eject it again")
	}
	if h.succeeded(slow, 300*time.Millisecond) || h.state.Load() != stateOpen || !h.trialFailed.Load() {
		t.Fatalf("a late answer of a call sent two ejections ago: state %d, trial failed %v, want ejected, true", h.state.Load(), h.trialFailed.Load())
	}
	if h.probeAnswered() {
		t.Fatal("after a late answer, the probe shortened the ejection that followed a failed trial")
	}
	// The next trial's answer closes it.
	h.openUntil.Store(time.Now().UnixNano())
	trial, ok = h.take(time.Now().UnixNano())
	if !ok || !trial.trial || !h.succeeded(trial, time.Millisecond) || h.state.Load() != stateClosed {
		t.Fatal("the answer of the trial sent after the ejection did not close the breaker")
	}
}

// A replica that breaks its answers after their first byte, back from an
// ejection, fails its trial with the first answer it breaks: ejected for
// twice as long each time, up to eject_max, and the probe no longer ends
// that early. Its trial was judged at the first byte: a replica that cut
// every stream after 5 events was ejected for eject_for, 1 s, every 1 to
// 2 s, and 10 to 15 % of the streams were cut for good.
func TestAnswersBrokenAfterAnEjectionEscalateIt(t *testing.T) {
	rt := testRouting("p2c")
	rt.EjectAfter, rt.EjectFor, rt.EjectMax = 3, time.Second, 4*time.Second
	p := testModelPool(t, 2)
	h := &p.members[0].up.health
	const cut = "stream was interrupted: unexpected EOF"
	for range 2 {
		if h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) {
			t.Fatal("ejected before eject_after broken answers")
		}
	}
	if !h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) || h.ejectFor != rt.EjectFor || h.trialFailed.Load() {
		t.Fatalf("eject_after broken answers: ejected for %s (trial failed: %v), want eject_for", h.ejectFor, h.trialFailed.Load())
	}
	// back returns it as its trial does: its first byte closes the breaker.
	back := func() (sentBefore ticket) {
		t.Helper()
		sentBefore = sentNow(h) // in flight across the return
		h.openUntil.Store(time.Now().UnixNano())
		trial, ok := h.take(time.Now().UnixNano())
		if !ok || !trial.trial || !h.succeeded(trial, time.Millisecond) {
			t.Fatal("no trial, or its first byte did not close the breaker")
		}
		return sentBefore
	}
	if !h.probeAnswered() {
		t.Fatal("the probe did not end an ejection no trial had failed")
	}
	back()
	for _, want := range []time.Duration{2 * time.Second, 4 * time.Second, 4 * time.Second} {
		sent := sentNow(h)
		if !h.brokeMidAnswer(rt, cut, cut, sent, false, true) || h.ejectFor != want || !h.trialFailed.Load() {
			t.Fatalf("an answer broken after its return: ejected for %s (trial failed: %v), want %s and failed", h.ejectFor, h.trialFailed.Load(), want)
		}
		if h.probeAnswered() {
			t.Fatal("the probe ended the ejection of a replica whose answers break")
		}
		// Another call sent before this ejection breaks once it is back:
		// it only counts.
		back()
		if h.brokeMidAnswer(rt, cut, cut, sent, false, true) {
			t.Fatal("an answer sent before the ejection ejected it again")
		}
	}
	// An answer completed since its return proves it: one it breaks then
	// starts a streak, and the next ejection is for eject_for. One sent
	// before the return proves nothing.
	stale := sentNow(h)
	h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true)
	back()
	h.completedAnswer(stale, true)
	if !h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) {
		t.Fatal("an answer completed by a call sent before its ejection proved it back")
	}
	back()
	h.completedAnswer(sentNow(h), true)
	for range 2 {
		if h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) {
			t.Fatal("a replica that completed an answer since its return was ejected by one it broke")
		}
	}
	if !h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) || h.ejectFor != rt.EjectFor {
		t.Fatalf("eject_after broken answers after a completed one: ejected for %s, want eject_for", h.ejectFor)
	}
}

// Only an answer of the kind that broke ends the broken streak and
// proves the upstream back: a non-streamed answer says nothing of the
// streams it cuts. Any completed answer did: a replica that cut every
// stream after 5 events but answered non-streamed calls whole, under
// mixed traffic, was ejected for eject_for about every second (4 % of
// the streams cut), or never with one streaming client (18 to 25 %).
func TestOnlyAnAnswerOfTheKindThatBrokeEndsTheStreak(t *testing.T) {
	rt := testRouting("p2c")
	rt.EjectAfter, rt.EjectFor, rt.EjectMax = 3, time.Second, 8*time.Second
	p := testModelPool(t, 2)
	h := &p.members[0].up.health
	const cut = "stream was interrupted: unexpected EOF"
	for range 2 {
		if h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) {
			t.Fatal("ejected before eject_after broken streams")
		}
		h.completedAnswer(sentNow(h), false)
	}
	if !h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) || h.ejectFor != rt.EjectFor {
		t.Fatalf("eject_after cut streams, non-streamed answers between them: ejected for %s, want eject_for", h.ejectFor)
	}
	// Back, a non-streamed answer does not prove it: the next stream it
	// cuts fails its trial.
	h.openUntil.Store(time.Now().UnixNano())
	if trial, ok := h.take(time.Now().UnixNano()); !ok || !trial.trial || !h.succeeded(trial, time.Millisecond) {
		t.Fatal("no trial, or its first byte did not close the breaker")
	}
	if !h.oneCallAtATime(false) {
		t.Fatal("back from an ejection, it does not take one call at a time")
	}
	h.completedAnswer(sentNow(h), false)
	// Any completed answer ends its one call at a time, though only a
	// stream proves it: sent only non-streamed calls, it would have kept
	// to one at a time for as long.
	if h.oneCallAtATime(false) {
		t.Fatal("a completed non-streamed answer did not end its one call at a time")
	}
	if !h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) || h.ejectFor != 2*rt.EjectFor {
		t.Fatalf("a stream cut after a non-streamed answer since its return: ejected for %s, want twice eject_for", h.ejectFor)
	}
	// A completed stream proves it, and ends the streak.
	h.openUntil.Store(time.Now().UnixNano())
	if trial, ok := h.take(time.Now().UnixNano()); !ok || !h.succeeded(trial, time.Millisecond) || !trial.trial {
		t.Fatal("no trial")
	}
	h.completedAnswer(sentNow(h), true)
	for range 2 {
		if h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) {
			t.Fatal("a replica that completed a stream since its return was ejected by one it cut")
		}
	}
	h.completedAnswer(sentNow(h), true)
	for range 2 {
		if h.brokeMidAnswer(rt, cut, cut, sentNow(h), false, true) {
			t.Fatal("a completed stream did not end the streak")
		}
	}
}

// A member back from an ejection takes one call at a time until an
// answer of a call sent since completes, in every balance mode: judged
// at its first byte, a replica that stalls after it took its full share
// until its trial's idle_timeout ran out (4 to 5 streams of 8 clients
// hung each time it returned). Its one call is taken atomically, and a
// member alone eligible still gets calls.
func TestAMemberBackFromAnEjectionTakesOneCallAtATime(t *testing.T) {
	for _, mode := range config.BalanceModes {
		rt := testRouting(mode)
		p := testModelPool(t, 3)
		now := time.Now().UnixNano()
		for _, m := range p.members {
			m.up.health.succeeded(sentNow(&m.up.health), time.Millisecond) // none is new
		}
		h := &p.members[0].up.health
		h.mu.Lock()
		h.ejectLocked(rt.EjectFor)
		h.mu.Unlock()
		h.openUntil.Store(now)
		trial, ok := h.send(now)
		if !ok || !trial.trial || !h.succeeded(trial, time.Millisecond) {
			t.Fatalf("%s: no trial, or its first byte did not close the breaker", mode)
		}
		h.awaiting.Add(-1)
		h.inflight.Add(1) // the trial streams on, past its first byte
		for range 100 {
			up, i, _ := p.pick(rt, 0, 0)
			if i == 0 {
				t.Fatalf("%s: the member back from its ejection, its trial's answer not complete, was given a second call", mode)
			}
			up.health.awaiting.Add(-1)
		}
		// With every other member out, it takes calls: somewhere, not nowhere.
		if up, i, _ := p.pick(rt, 1<<1|1<<2, 0); i != 0 {
			t.Fatalf("%s: the only member left, back from its ejection, got no call (%v)", mode, up)
		} else {
			up.health.awaiting.Add(-1)
		}
		// Free again, it takes one call, once, however many pick at once.
		h.inflight.Add(-1)
		var got atomic.Int32
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for range 10 {
					if _, i, _ := p.pick(rt, 0, 0); i == 0 {
						got.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if n := got.Load(); n != 1 {
			t.Fatalf("%s: the member back from its ejection was given %d calls at once, want 1", mode, n)
		}
		// An answer completed proves it: it takes calls as any member.
		h.completedAnswer(sentNow(h), true)
		h.awaiting.Store(0)
		got.Store(0)
		for range 300 {
			up, i, _ := p.pick(rt, 0, 0)
			if i == 0 {
				got.Add(1)
			}
			up.health.awaiting.Add(-1)
		}
		if n := got.Load(); n < 50 {
			t.Fatalf("%s: proved back, it got %d of 300 calls", mode, n)
		}
	}
}

// A trial that decides nothing (a 429 without Retry-After, a client that
// left early) frees the slot: held, no call reached the upstream again.
func TestUndecidedTrialFreesItsSlot(t *testing.T) {
	rt := testRouting("p2c")
	p := testModelPool(t, 2)
	h := &p.members[0].up.health
	h.failed(rt, "refused", "refused", sentNow(h), false, false)
	h.failed(rt, "refused", "refused", sentNow(h), false, false)
	h.probeAnswered()
	trial, ok := h.take(time.Now().UnixNano())
	if !ok || h.available(time.Now().UnixNano()) {
		t.Fatal("no trial, or a second call beside it")
	}
	h.undecided(sentNow(h)) // not the trial: frees nothing
	if h.available(time.Now().UnixNano()) {
		t.Fatal("a call that was not the trial freed its slot")
	}
	h.undecided(trial)
	if _, ok := h.take(time.Now().UnixNano()); !ok {
		t.Fatal("no call let through after a trial that decided nothing")
	}
}

// An upstream alone in a pool takes its calls even while another pool's
// failures have it ejected, or a rest holds it: a rest once refused every
// caller of the model after one caller's 429.
func TestPoolOfOneIgnoresEjectionAndRest(t *testing.T) {
	rt := testRouting("p2c")
	p := testModelPool(t, 1)
	h := &p.members[0].up.health
	h.failed(rt, "refused", "refused", sentNow(h), false, false)
	h.failed(rt, "refused", "refused", sentNow(h), false, false)
	if up, _, _ := p.pick(rt, 0, 0); up == nil {
		t.Fatal("the only upstream, ejected through another pool, was not picked")
	}
	h.rest(time.Minute, "429")
	if up, _, _ := p.pick(rt, 0, 0); up == nil {
		t.Fatal("the only upstream, resting after a 429 through another pool, was not picked")
	}
	// Its answer there does not end the rest the other pool honours.
	h.succeeded(sentNow(h), time.Millisecond)
	if !h.resting.Load() || h.available(time.Now().UnixNano()) {
		t.Fatal("an answer to the model it serves alone ended the upstream's rest")
	}
}

func TestPickSkipsTriedAndEjected(t *testing.T) {
	for _, mode := range config.BalanceModes {
		rt := testRouting(mode)
		p := testModelPool(t, 3)
		p.members[1].up.health.rest(time.Minute, "429")
		for range 50 {
			up, i, _ := p.pick(rt, 1<<0, 0)
			if up == nil || i != 2 {
				t.Fatalf("%s: picked %d with u0 tried and u1 resting", mode, i)
			}
			p.members[2].up.health.trial.Store(false)
		}
		if up, _, _ := p.pick(rt, 1<<0|1<<2, 0); up != nil {
			t.Fatalf("%s: picked with every member tried or out", mode)
		}
	}
}

func TestAffinityKeepsAKeyOnOneMember(t *testing.T) {
	rt := testRouting("p2c")
	p := testModelPool(t, 4)
	for key := uint64(1); key < 200; key += 7 {
		first, _, _ := p.pick(rt, 0, key)
		for range 5 {
			if up, _, _ := p.pick(rt, 0, key); up != first {
				t.Fatalf("key %d moved from %s to %s", key, first.cfg.Name, up.cfg.Name)
			}
		}
	}
}

// At idle, with every member as fast, p2c gives each member its weight's
// share of the calls, as round_robin does. The weight was applied twice,
// in the draw and again in the cost: a member of weight 2 beside two of
// weight 1 got about 80 % of the calls instead of 50 %. least_in_flight
// gave every call to the heaviest member (or the first, weights equal):
// at idle each is tied with none in flight.
func TestBalanceModesShareByWeightAtIdle(t *testing.T) {
	p := testWeightedPool(t, 1, 1, 2)
	now := time.Now().UnixNano()
	for _, m := range p.members {
		// Answered as fast as its peers, just now: no slow start.
		m.up.health.latency.Store(int64(time.Millisecond))
		m.up.health.answered.Store(int64(time.Millisecond))
		m.up.health.sampled.Store(now)
	}
	for _, mode := range []string{"p2c", "round_robin", "least_in_flight"} {
		rt := testRouting(mode)
		const calls = 20000
		var got [3]int
		for range calls {
			up, i, _ := p.pick(rt, 0, 0)
			up.health.awaiting.Add(-1) // answered at once: the pool stays idle
			got[i]++
		}
		for i, want := range []float64{0.25, 0.25, 0.5} {
			if share := float64(got[i]) / calls; share < want-0.03 || share > want+0.03 {
				t.Errorf("%s: weights 1, 1, 2 at idle gave u%d %.1f %% of the calls, want %.0f %%", mode, i, 100*share, 100*want)
			}
		}
	}
}

// Under load, like members share by weight too: a member of weight 2
// carries twice the calls in flight of its peers of weight 1, and its
// calls, counted whole, made it lose every pairing with them (36 % of the
// calls where 50 % was asked for).
func TestP2CSharesByWeightUnderLoad(t *testing.T) {
	p := testWeightedPool(t, 1, 1, 2)
	now := time.Now().UnixNano()
	for _, m := range p.members {
		m.up.health.latency.Store(int64(10 * time.Millisecond))
		m.up.health.answered.Store(int64(10 * time.Millisecond))
		m.up.health.sampled.Store(now)
		m.up.health.inflight.Store(int64(2 * m.weight)) // streaming, their first bytes long sent
	}
	rt := testRouting("p2c")
	const calls = 20000
	var got [3]int
	for range calls {
		up, i, _ := p.pick(rt, 0, 0)
		up.health.awaiting.Add(-1)
		got[i]++
	}
	for i, want := range []float64{0.25, 0.25, 0.5} {
		if share := float64(got[i]) / calls; share < want-0.03 || share > want+0.03 {
			t.Errorf("weights 1, 1, 2 with 2, 2 and 4 calls in flight gave u%d %.1f %% of the calls, want %.0f %%", i, 100*share, 100*want)
		}
	}
}

// At idle, members whose latencies differ by noise (a tenth of a
// millisecond of a millisecond) share calls by weight: the one measured
// fastest won every pairing it was drawn into, and a member of weight 2
// got 59-79 % of one client's calls instead of 50 %. One clearly faster
// still wins its pairings.
func TestP2CTakesCloseLatenciesAsATie(t *testing.T) {
	p := testWeightedPool(t, 1, 1, 2)
	now := time.Now().UnixNano()
	measure := func(latencies ...time.Duration) {
		for i, lat := range latencies {
			h := &p.members[i].up.health
			h.latency.Store(int64(lat))
			h.answered.Store(int64(lat))
			h.sampled.Store(now)
		}
	}
	shares := func() (got [3]float64) {
		rt := testRouting("p2c")
		const calls = 20000
		for range calls {
			up, i, _ := p.pick(rt, 0, 0)
			up.health.awaiting.Add(-1) // answered at once: the pool stays idle
			got[i] += 1.0 / calls
		}
		return got
	}
	measure(11*time.Millisecond, 10*time.Millisecond, 9500*time.Microsecond)
	got := shares()
	for i, want := range []float64{0.25, 0.25, 0.5} {
		if got[i] < want-0.03 || got[i] > want+0.03 {
			t.Errorf("latencies 11, 10 and 9.5 ms, weights 1, 1, 2: u%d got %.1f %% of the calls, want %.0f %%", i, 100*got[i], 100*want)
		}
	}
	// u0, twice as fast as the others, wins every pairing it is drawn
	// into: all but those of u1 and u2, 7 in 12.
	measure(5*time.Millisecond, 10*time.Millisecond, 10*time.Millisecond)
	if got := shares(); got[0] < 0.55 {
		t.Errorf("u0, twice as fast, got %.1f %% of the calls, want the pairings it is in (about 58 %%)", 100*got[0])
	}
}

// At sub-millisecond answers, a difference of cost under a millisecond is
// a tie, however large a fraction: one first byte delayed by the host
// moved a member's average past the quarter that is a tie, and it lost
// every pairing until its average was halved a second later (three like
// members answering in 1 ms got 7, 690 and 803 of 1,500 calls).
func TestP2CTakesASubMillisecondDifferenceAsATie(t *testing.T) {
	p := testModelPool(t, 3)
	for _, m := range p.members {
		for range 20 {
			m.up.health.succeeded(sentNow(&m.up.health), time.Millisecond)
		}
	}
	delayed := &p.members[0].up.health
	delayed.succeeded(sentNow(delayed), 4*time.Millisecond) // one first byte the host delayed
	if lat := time.Duration(delayed.latency.Load()); lat < 1300*time.Microsecond {
		t.Fatalf("latency %s after a 4 ms sample, want it past a quarter above 1 ms", lat)
	}
	// And one it delayed long: on a loaded 2-core host a 30 ms first
	// byte took a 1 ms member's average to 4.6 ms, past the millisecond,
	// and it got no call for a second.
	delayed = &p.members[1].up.health
	delayed.succeeded(sentNow(delayed), 30*time.Millisecond)
	rt := testRouting("p2c")
	const calls = 3000
	var got [3]int
	for range calls {
		up, i, _ := p.pick(rt, 0, 0)
		up.health.awaiting.Add(-1) // answered at once, unsampled: the averages stay
		got[i]++
	}
	for i, n := range got {
		if share := float64(n) / calls; share < 0.28 || share > 0.39 {
			t.Errorf("members answering in 1 ms, u0 once in 4 ms, u1 once in 30 ms: u%d got %d of %d calls, want a third", i, n, calls)
		}
	}
}

// A member that really got slower is priced so within a few samples,
// for all that one sample counts for at most four times its average.
func TestP2CFollowsAMemberThatGotSlower(t *testing.T) {
	p := testModelPool(t, 2)
	for _, m := range p.members {
		for range 20 {
			m.up.health.succeeded(sentNow(&m.up.health), 100*time.Millisecond)
		}
	}
	slow := &p.members[0].up.health
	for range 3 {
		slow.succeeded(sentNow(slow), time.Second)
	}
	rt := testRouting("p2c")
	var got [2]int
	for range 1000 {
		up, i, _ := p.pick(rt, 0, 0)
		up.health.awaiting.Add(-1)
		got[i]++
	}
	if got[0] > 50 {
		t.Fatalf("u0 answering in 1 s after 100 ms got %d of 1000 calls, want few", got[0])
	}
}

// BenchmarkPick is what choosing an upstream costs per call: the one-member
// pool every model had before pools, and three members per mode.
func BenchmarkPick(b *testing.B) {
	b.Run("one", func(b *testing.B) {
		rt, p := testRouting("p2c"), testModelPool(b, 1)
		b.ReportAllocs()
		for b.Loop() {
			up, _, _ := p.pick(rt, 0, 0)
			up.health.awaiting.Add(-1) // the call answered
		}
	})
	for _, mode := range config.BalanceModes {
		b.Run("three-"+mode, func(b *testing.B) {
			rt, p := testRouting(mode), testModelPool(b, 3)
			b.ReportAllocs()
			for b.Loop() {
				up, _, _ := p.pick(rt, 0, 0)
				up.health.awaiting.Add(-1)
			}
		})
	}
}

// A replica measured slow once, and not since, wins pairings again after a
// few seconds, and its next call measures it anew: it lost every pairing
// at light load for good when its latency was never forgotten.
func TestP2CForgetsAnUnsampledLatency(t *testing.T) {
	p := testModelPool(t, 2)
	now := time.Now().UnixNano()
	slow, fast := &p.members[0].up.health, &p.members[1].up.health
	slow.latency.Store(int64(100 * time.Millisecond))
	slow.sampled.Store(now)
	fast.latency.Store(int64(10 * time.Millisecond))
	fast.sampled.Store(now)
	for range 20 {
		if i := p.choose("p2c", now, 0); i != 1 {
			t.Fatalf("a replica measured 10 times slower just now was chosen (member %d)", i)
		}
	}
	later := now + int64(5*time.Second) // the slow one's last sample is 5 s old, the fast one's too
	fast.sampled.Store(later)           // but the fast one was just measured again
	if i := p.choose("p2c", later, 0); i != 0 {
		t.Fatalf("member %d chosen: the replica unsampled for 5 s still lost to one measured now", i)
	}
}

// A replica holding calls it does not answer (hung, SIGSTOPped) keeps its
// latency, so the calls it holds make it dearer: forgetting it made its
// cost fall to nothing, and p2c sent it every call.
func TestP2CAvoidsAReplicaHoldingUnansweredCalls(t *testing.T) {
	p := testModelPool(t, 2)
	now := time.Now().UnixNano()
	hung, busy := &p.members[0].up.health, &p.members[1].up.health
	// The hung one was the faster before it stopped: its average alone
	// kept it ahead however many calls it held.
	hung.latency.Store(int64(400 * time.Microsecond))
	hung.answered.Store(int64(400 * time.Microsecond))
	hung.sampled.Store(now - int64(2*time.Second)) // nothing answered for 2 s
	hung.inflight.Store(1)
	hung.awaiting.Store(1)
	hung.awaitingSince.Store(now - int64(2*time.Second))
	busy.latency.Store(int64(3 * time.Millisecond))
	busy.answered.Store(int64(3 * time.Millisecond))
	busy.sampled.Store(now)
	busy.inflight.Store(4)
	busy.awaiting.Store(4)
	busy.awaitingSince.Store(now - int64(time.Second)) // always some waiting, answers coming
	for range 20 {
		if i := p.choose("p2c", now, 0); i != 1 {
			t.Fatal("the replica with a call unanswered for 2 s was chosen over one answering")
		}
	}
	// A replica that never answered takes one call at a time until it
	// answers, however short the wait so far: priced at a fixed
	// initialLatency, or by its wait, it drew most clients in its first
	// second when stopped before its first answer.
	hung.latency.Store(0)
	hung.answered.Store(0)
	hung.sampled.Store(0)
	hung.awaitingSince.Store(now)
	for range 20 {
		if i := p.choose("p2c", now, 0); i != 1 {
			t.Fatal("a replica that never answered, with a call waiting on it, was chosen over one answering")
		}
	}
	// Calls streaming after their first byte are no sign of a hang.
	hung.latency.Store(int64(400 * time.Microsecond))
	hung.awaiting.Store(0)
	hung.inflight.Store(1)
	if i := p.choose("p2c", now, 0); i != 0 {
		t.Fatal("a replica streaming one answer lost to one holding four calls")
	}
}

// Slow start holds under concurrent picks: a replica that never answered
// is given one call, however many callers choose at the same moment.
// Counted after pick returned, the call was not seen by the picks beside
// it, and 2 to 3 of 8 clients got stuck on a replica stopped before its
// first answer.
func TestSlowStartGivesOneCallUnderConcurrentPicks(t *testing.T) {
	rt := testRouting("p2c")
	p := testModelPool(t, 3)
	for _, m := range p.members[:2] {
		// Slower than the new one's initialLatency: it wins every pairing
		// it is free for.
		m.up.health.answered.Store(int64(5 * time.Millisecond))
		m.up.health.latency.Store(int64(5 * time.Millisecond))
		m.up.health.sampled.Store(time.Now().UnixNano())
	}
	fresh := p.members[2].up
	var got atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 20 {
				if up, _, _ := p.pick(rt, 0, 0); up == fresh {
					got.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := got.Load(); n != 1 {
		t.Fatalf("the replica that never answered was given %d calls at once, want 1", n)
	}
}

// Members that never answered and hold their first call are left out of
// the draw while another can take the call: priced alike (the most a cost
// can be), two of them drawn together tied, and the first drawn, a
// stopped one a third of the time, got the call. When every member is
// so, the call still goes to one of them.
func TestSlowStartLeavesOutEveryNewMemberHoldingACall(t *testing.T) {
	rt := testRouting("p2c")
	p := testModelPool(t, 3)
	now := time.Now().UnixNano()
	for _, i := range []int{0, 2} {
		p.members[i].up.health.await(now)
	}
	for range 100 {
		up, i, _ := p.pick(rt, 0, 0)
		if i != 1 {
			t.Fatalf("member %d, which never answered and holds a call, was chosen", i)
		}
		up.health.awaiting.Add(-1)
	}
	p.members[1].up.health.await(now)
	if up, _, _ := p.pick(rt, 0, 0); up == nil {
		t.Fatal("every member new and holding a call: the call went nowhere")
	}
}

// A call whose client left before the upstream answered counts its wait
// as a first byte's time: a stopped replica whose calls all outlasted
// their clients' timeouts looked idle and fast, and was never ejected.
func TestACallHeldUntilItsClientLeftCountsAsSlow(t *testing.T) {
	p := testModelPool(t, 1)
	h := &p.members[0].up.health
	h.succeeded(sentNow(h), time.Millisecond)
	if !h.held(2 * time.Second) {
		t.Fatal("a call held 2 s by a replica answering in 1 ms is no failure")
	}
	if got := time.Duration(h.latency.Load()); got < 200*time.Millisecond {
		t.Fatalf("latency %s after a call held 2 s", got)
	}
	// The other clients that gave up at that moment are failures too:
	// judged against the average with the first wait in it, seven stuck
	// clients made one failure and the replica was not ejected.
	for i := range 6 {
		if !h.held(2 * time.Second) {
			t.Fatalf("client %d of 7 leaving a replica answering in 1 ms after 2 s is no failure", i+2)
		}
	}
	// One that never answered a call counts as fast.
	fresh := &testModelPool(t, 1).members[0].up.health
	if !fresh.held(2 * time.Second) {
		t.Fatal("a call held 2 s by a replica that never answered is no failure")
	}
	// A long generation its client gave up on is slow, not failed.
	slow := &testModelPool(t, 1).members[0].up.health
	slow.succeeded(sentNow(slow), 20*time.Second)
	if slow.held(10 * time.Second) {
		t.Fatal("a call held 10 s by a replica answering in 20 s counted as a failure")
	}
}

// A sample of a replica slow once and idle since is blended into its
// latency as cost saw it, forgotten: blended into the stored one, each
// call brought the old penalty back and the replica stayed starved.
func TestLatencySampleBlendsIntoTheForgottenAverage(t *testing.T) {
	p := testModelPool(t, 1)
	h := &p.members[0].up.health
	h.latency.Store(int64(320 * time.Millisecond))
	h.sampled.Store(time.Now().Add(-5 * time.Second).UnixNano())
	h.succeeded(sentNow(h), 5*time.Millisecond)
	if got := time.Duration(h.latency.Load()); got > 20*time.Millisecond {
		t.Fatalf("latency %s after a 5 ms answer, 5 s after a 320 ms average", got)
	}
}

// A probe that answers makes the next call a trial and keeps the ejection
// time, so an upstream whose API server answers GET /models while its
// engine fails every call stays out twice as long each time; closing the
// breaker on the probe reset it to eject_for every probe_interval. A rest
// after a 429 is not ended by the probe.
func TestProbeAnswerLeadsToATrial(t *testing.T) {
	rt := testRouting("p2c")
	p := testModelPool(t, 2)
	h := &p.members[0].up.health
	h.failed(rt, "500", "500", sentNow(h), false, true)
	h.failed(rt, "500", "500", sentNow(h), false, true)
	if !h.probeAnswered() {
		t.Fatal("the probe's answer did not end the ejection")
	}
	trial, ok := h.take(time.Now().UnixNano())
	if !ok {
		t.Fatal("no trial call after the probe answered")
	}
	if h.available(time.Now().UnixNano()) {
		t.Fatal("a second call went out beside the trial")
	}
	h.failed(rt, "500", "500", trial, false, true) // the trial failed
	if h.ejectFor != 2*rt.EjectFor {
		t.Fatalf("ejected for %s after a failed trial, want %s", h.ejectFor, 2*rt.EjectFor)
	}
	// Its GET /models answering says nothing of its calls any more: the
	// doubled ejection runs its course.
	if h.probeAnswered() {
		t.Fatal("the probe ended the ejection that followed a failed trial")
	}
	h.rest(time.Minute, "429")
	if h.probeAnswered() || h.available(time.Now().UnixNano()) {
		t.Fatal("the probe ended a rest a 429 asked for")
	}
	// A trial that could not connect (a replica restarting) leaves the
	// probe to bring it back within a probe_interval of its return.
	down := &p.members[1].up.health
	down.failed(rt, "refused", "refused", sentNow(down), false, false)
	down.failed(rt, "refused", "refused", sentNow(down), false, false)
	time.Sleep(60 * time.Millisecond)
	trial, ok = down.take(time.Now().UnixNano())
	if !ok {
		t.Fatal("no trial after eject_for")
	}
	down.failed(rt, "refused", "refused", trial, false, false) // the trial failed
	if !down.probeAnswered() {
		t.Fatal("after a trial that could not connect, the probe's answer did not end the ejection")
	}
	// Due its trial, it wins the pairing against a peer however fast,
	// beyond the millisecond that is a tie: one that had never answered
	// lost every pairing to faster peers.
	p.members[0].up.health.close()
	p.members[0].up.health.latency.Store(int64(2 * time.Millisecond))
	p.members[0].up.health.sampled.Store(time.Now().UnixNano())
	if i := p.choose("p2c", time.Now().UnixNano(), 0); i != 1 {
		t.Fatalf("member %d chosen over the one due its trial", i)
	}
}

// TestRetryAfter: seconds or an HTTP date, capped at 10 minutes; anything
// else rests nothing. A date was ignored, so an upstream that sent one
// was not rested.
func TestRetryAfter(t *testing.T) {
	for _, c := range []struct {
		value    string
		min, max time.Duration
	}{
		{"", 0, 0},
		{"30", 30 * time.Second, 30 * time.Second},
		{"0.5", 500 * time.Millisecond, 500 * time.Millisecond},
		{"99999", 10 * time.Minute, 10 * time.Minute},
		{"+Inf", 10 * time.Minute, 10 * time.Minute},
		{"NaN", 0, 0},
		{"-5", 0, 0},
		{"soon", 0, 0},
		{time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat), 85 * time.Second, 90 * time.Second},
		{time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), 0, 0},
	} {
		var h fasthttp.ResponseHeader
		if c.value != "" {
			h.Set("Retry-After", c.value)
		}
		if got := retryAfter(&h); got < c.min || got > c.max {
			t.Errorf("Retry-After %q: %v, want %v..%v", c.value, got, c.min, c.max)
		}
	}
}

// The recent calls and error rate cover this minute and the one before,
// also for an upstream that had no call since: they showed its last
// failures as recent, a 100 % error rate, until its next call.
func TestRecentCallsAgeWithoutCalls(t *testing.T) {
	var h upstreamHealth
	h.count(true)
	h.count(true)
	h.count(false)
	now := time.Now()
	if calls, fails := h.recent(now); calls != 3 || fails != 2 {
		t.Fatalf("now: %d calls, %d failed; want 3 and 2", calls, fails)
	}
	if calls, fails := h.recent(now.Add(time.Minute)); calls != 3 || fails != 2 {
		t.Fatalf("a minute later: %d calls, %d failed; want 3 and 2 (the previous minute)", calls, fails)
	}
	if calls, fails := h.recent(now.Add(2 * time.Minute)); calls != 0 || fails != 0 {
		t.Fatalf("two minutes later: %d calls, %d failed; want none", calls, fails)
	}
}

// Label values are escaped as Prometheus reads them: %q wrote a tab in an
// upstream's name as \t, which fails the whole scrape.
func TestPromLabel(t *testing.T) {
	for in, want := range map[string]string{
		"local":      `"local"`,
		"tab\there":  "\"tab\there\"",
		`a"b\c`:      `"a\"b\\c"`,
		"line\nfeed": `"line\nfeed"`,
		"é":          `"é"`,
	} {
		if got := promLabel(in); got != want {
			t.Errorf("promLabel(%q) = %s, want %s", in, got, want)
		}
	}
}

// available is take without its ticket, for the tests of the breaker's
// states.
func (h *upstreamHealth) available(now int64) bool {
	_, ok := h.take(now)
	return ok
}
