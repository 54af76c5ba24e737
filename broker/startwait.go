package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/internal/loglimit"
)

// startLogEvery is how often a start waiting for JetStream says so.
const startLogEvery = 5 * time.Second

// startJetStream is a broker's JetStream while its process starts: until
// nats.start_timeout after the connection, EnsureStream and EnsureKV made
// through it try again while their error is one an election explains. A
// cluster without a meta leader (a node just lost, or the cluster
// starting with the gateways) did not answer the first declaration
// within the client's 5 s, and the gateway exited: an orchestrator
// restarted it into the same election, over and over.
type startJetStream struct {
	jetstream.JetStream
	wait *startWait
}

// startWait is how long, and where, a start waits for JetStream.
type startWait struct {
	until   time.Time
	timeout time.Duration        // nats.start_timeout, for messages
	logf    func(string, ...any) // nil: silent
}

// declareAtStart runs declare once, or, with a broker's JetStream whose
// start wait has not run out, again while it fails with an error an
// election explains, each try within the client's timeout, saying every
// few seconds what the start waits for. what names the declaration in
// those lines ("stream USAGE").
func declareAtStart[T any](ctx context.Context, js jetstream.JetStream, what string, declare func(context.Context) (T, error)) (T, error) {
	sj, ok := js.(*startJetStream)
	if !ok || !time.Now().Before(sj.wait.until) {
		return declare(ctx)
	}
	w := sj.wait
	var waitLog loglimit.Limiter
	var lastWhy string // of the last try that had the client's whole timeout
	var lastErr error
	pause := 100 * time.Millisecond
	for {
		tryTimeout := min(time.Until(w.until), js.Options().DefaultTimeout)
		tryCtx, cancel := context.WithTimeout(ctx, tryTimeout)
		v, err := declare(tryCtx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		why, explained := electionExplains(err)
		if !explained {
			return v, err
		}
		if notRunning(js.Conn(), err) {
			// A server whose INFO says it runs no JetStream gives no
			// responders, as one still starting does; waiting for it
			// would only hold the start for nats.start_timeout.
			return v, fmt.Errorf("%w: the NATS server at %s does not run JetStream (enable jetstream in its configuration)", err, js.Conn().ConnectedUrlRedacted())
		}
		if denied := js.Conn().LastError(); errors.Is(denied, nats.ErrPermissionViolation) {
			// A request the server denies is dropped unanswered: the
			// refusal comes to the connection, and the request times out.
			return v, fmt.Errorf("%w (%v)", err, denied)
		}
		left := time.Until(w.until)
		if left <= 0 {
			// The last try was cut to the time left, and its timeout
			// says nothing of why: the try before it does.
			if tryTimeout < js.Options().DefaultTimeout && lastErr != nil {
				why, err = lastWhy, lastErr
			}
			return v, fmt.Errorf("NATS's JetStream not ready within nats.start_timeout (%s; raise it in gateway.yaml to wait longer): %s: %w", w.timeout, why, err)
		}
		if tryTimeout >= js.Options().DefaultTimeout || !errors.Is(err, context.DeadlineExceeded) {
			lastWhy, lastErr = why, err
		}
		if ok, _ := waitLog.Allow(time.Now(), startLogEvery); ok && w.logf != nil {
			w.logf("nats: waiting for the NATS cluster's JetStream to declare %s: %s (%v); giving up in %s (nats.start_timeout %s)",
				what, why, err, left.Round(time.Second), w.timeout)
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(min(pause, left)):
		}
		pause = min(2*pause, time.Second)
	}
}

// electionExplains says whether err, from a JetStream API request, is one
// an election explains, and how: no answer (no meta leader, or a
// stream's leader being elected), no JetStream subscribed yet (a server
// starting), or the cluster's own word for it. Anything else (a stream's
// configuration refused, a permission denied, an account without
// JetStream) is no election, and waiting would not mend it.
func electionExplains(err error) (string, bool) {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return "no answer: no JetStream meta leader, or a stream's leader being elected", true
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		// A server still starting, or one without JetStream (notRunning).
		return "no server answers the JetStream API yet", true
	case !errors.As(err, &apiErr):
		return "", false
	}
	// The server's own error identifiers (its errors.json).
	switch server.ErrorIdentifier(apiErr.ErrorCode) {
	case server.JSClusterNotAvailErr, // no meta leader: "JetStream system temporarily unavailable"
		server.JSClusterNotLeaderErr: // asked a server that lost its leadership meanwhile
		return "no JetStream meta leader", true
	case server.JSStreamOfflineErr: // every node of the stream down
		return "the stream's nodes are down", true
	case server.JSClusterNoPeersErrF: // "no suitable peers for placement", with its reasons
		// The cluster's own reason: a node lost, or not yet known to a
		// meta leader just elected. Too few nodes for nats.replicas is
		// said without it, and fails at once.
		if strings.Contains(apiErr.Description, "peer offline") {
			return "too few nodes up for nats.replicas", true
		}
	}
	return "", false
}

// notRunning says err is a JetStream API request nobody answered, or
// answered that JetStream is not enabled, from a server whose INFO says
// it runs no JetStream: no election, and no wait, brings it.
func notRunning(nc *nats.Conn, err error) bool {
	if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return false
	}
	on, _ := nc.ConnectedServerJetStream()
	return !on
}
