package batch_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
)

// leaderAPI is the JetStream API as a service sees it through a stream
// leader that can die: its requests are forwarded to the server's API
// while the leader lives, and go unanswered while silent is set, as a
// request sent to a leader SIGKILLed is (its replacement, elected 4 to
// 8 s later, answers requests sent again, never that one).
type leaderAPI struct {
	silent atomic.Bool
	// unanswered counts the requests dropped while silent.
	unanswered atomic.Int64
}

// answerAgainAfter makes the leader answer again once it has left n more
// requests unanswered: a new leader elected after that many tries of the
// service, however long a busy machine made them take.
func (l *leaderAPI) answerAgainAfter(ctx context.Context, n int64) {
	until := l.unanswered.Load() + n
	go func() {
		for l.unanswered.Load() < until {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		l.silent.Store(false)
	}()
}

const leaderAPIPrefix = "$LEADER.API"

func (e *env) serviceBehindLeader(l *leaderAPI) *batch.Service {
	e.t.Helper()
	forward := e.broker.Conn()
	sub, err := forward.Subscribe(leaderAPIPrefix+".>", func(m *nats.Msg) {
		if l.silent.Load() {
			l.unanswered.Add(1)
			return
		}
		go func() {
			// A KV write comes prefixed too: it goes to the bucket's
			// subject, the rest to the API.
			subject := strings.TrimPrefix(m.Subject, leaderAPIPrefix+".")
			if !strings.HasPrefix(subject, "$KV.") {
				subject = "$JS.API." + subject
			}
			req := &nats.Msg{Subject: subject, Data: m.Data, Header: m.Header}
			resp, err := forward.RequestMsg(req, 5*time.Second)
			if err != nil {
				return
			}
			_ = m.RespondMsg(&nats.Msg{Data: resp.Data, Header: resp.Header})
		}()
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	b, err := broker.Start(e.ctx, config.NATS{URL: e.broker.ClientURL()}, e.dir, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(b.Close)
	js, err := jetstream.NewWithAPIPrefix(b.Conn(), leaderAPIPrefix)
	if err != nil {
		e.t.Fatal(err)
	}
	svc, err := batch.Open(e.ctx, js, e.store, batch.Options{Runtime: e.rt, Recorder: e.rec, Logf: e.t.Logf})
	if err != nil {
		e.t.Fatal(err)
	}
	return svc
}

// POST /v1/batch waited its whole 30 s (the plugin's bound of a call) and
// then was a 503 when the leader of BATCH_PENDING or BATCH_CREATED was
// killed, even with a new leader up 4 s later: the one count it asked for
// was never answered. Its NATS work is now asked again within a bound of
// 10 s, as the account store's calls are bound: it succeeds once the new
// leader answers, and fails within the bound when none does.
func TestCreateDuringALeaderElection(t *testing.T) {
	e := newEnv(t, envOptions{batch: "  checkpoint_lines: 300\n  concurrency: 4\n  max_pending_jobs: 10\n  max_jobs_created_per_hour: 100"})
	leader := &leaderAPI{}
	svc := e.serviceBehindLeader(leader)
	req := batch.Request{Labels: []string{"billing", "bug", "other"}, Mode: "single", Threshold: 0.5}
	create := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second) // as the plugin calls it
		defer cancel()
		began := time.Now()
		_, err := svc.Create(ctx, batch.CreateParams{Account: "acme", KeyID: "key-acme", Request: req})
		return time.Since(began), err
	}
	if took, err := create(); err != nil || took > 5*time.Second {
		t.Fatalf("a job created with its leaders up: %v after %s", err, took)
	}

	leader.silent.Store(true)
	took, err := create()
	// Well short of the plugin's 30 s, with room for a busy machine past
	// the 10 s bound.
	if err == nil || took > 15*time.Second {
		t.Fatalf("a job created while no leader answers: %v after %s, want an error within about 10 s", err, took)
	}

	// The new leader answers after two of the service's tries went
	// unanswered, about 4 s in: counted, not timed, so that on a busy
	// machine the try due then is not sent just before it answers, which
	// left the rest of the job 4 s of its bound instead of 6.
	leader.answerAgainAfter(e.ctx, 2)
	if took, err := create(); err != nil || took > 10*time.Second {
		t.Fatalf("a job created while a new leader is elected (two tries unanswered, about 4 s): %v after %s, want the job within 10 s", err, took)
	}
}
