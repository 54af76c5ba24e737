package broker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// declareLikeAStart declares what a gateway's start does, on b: a
// replicated bucket and stream.
func declareLikeAStart(ctx context.Context, b *Broker) error {
	if _, err := EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "START_WAIT", Replicas: 3}); err != nil {
		return err
	}
	_, err := EnsureStream(ctx, b.JetStream(), jetstream.StreamConfig{Name: "START_WAIT_EVENTS", Subjects: []string{"startwait.>"}, Replicas: 3})
	return err
}

// A gateway started while its NATS cluster had no JetStream meta leader
// (a node just lost, or the cluster starting with the gateways) exited
// after 5 s, "ensuring kv bucket ...: context deadline exceeded", and an
// orchestrator restarting it met the same election. The start waits for
// JetStream up to nats.start_timeout, saying so, then gives up naming it.
func TestStartWaitsOutAJetStreamElection(t *testing.T) {
	// No deadline, as a gateway's start has none: the client's own 5 s
	// bounded each declaration.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	servers, urls := testutil.StartNATSCluster(t, 3)
	// The deployment as it ran: its bucket and stream are there.
	b, err := Start(ctx, config.NATS{URL: strings.Join(urls, ","), Replicas: 3}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := declareLikeAStart(ctx, b); err != nil {
		t.Fatal(err)
	}
	b.Close()

	// Two nodes lost, the meta leader one of them: the node left has no
	// leader, and cannot elect one alone.
	survivor := slices.IndexFunc(servers, func(s *server.Server) bool { return !s.JetStreamIsLeader() })
	var lost []*server.Server
	for i, s := range servers {
		if i != survivor {
			s.Shutdown()
			lost = append(lost, s)
		}
	}
	// Two starts on the node left: one bounded by 2 s, the other by 40 s.
	// A node comes back once the second has said it waits (its first
	// try unanswered, after the client's 5 s): the first has given up by
	// then, naming its bound; the second waits for the election, then
	// declares. Each try sent during the election goes unanswered for
	// the client's 5 s, and the declarations took up to 16 s.
	startOn := func(timeout time.Duration, logf func(string, ...any)) (*Broker, <-chan error) {
		b, err := Start(ctx, config.NATS{URL: urls[survivor], Replicas: 3, StartTimeout: timeout}, t.TempDir(), logf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		declared := make(chan error, 1)
		go func() { declared <- declareLikeAStart(ctx, b) }()
		return b, declared
	}
	began := time.Now()
	_, gaveUp := startOn(2*time.Second, nil)
	var log testutil.Log
	b, declared := startOn(40*time.Second, log.Logf)
	// Not a node back after a fixed 3 s: an election done within the
	// first try's 5 s answered that try, and nothing said the start had
	// waited.
	testutil.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		if log.Count("nats: waiting for the NATS cluster's JetStream to declare ") == 0 {
			return errors.New("no line says the start waits")
		}
		return nil
	})
	select {
	case err := <-declared:
		t.Fatalf("declared with no meta leader: %v", err)
	default:
	}
	testutil.RestartNATSNode(t, lost[0])
	if err := <-declared; err != nil {
		t.Fatalf("a start during the election, a node back after it said it waits: %v (log:\n%s)", err, log.String())
	}
	select {
	case err := <-gaveUp:
		if err == nil || !strings.Contains(err.Error(), "nats.start_timeout (2s") {
			t.Errorf("a start with no meta leader: %v, want it to give up naming nats.start_timeout (2s)", err)
		}
		t.Logf("gave up: %v", err)
	case <-time.After(10 * time.Second):
		// Not 1 s, for a busy machine: a start that waited past its
		// 2 s would have declared by now, with the node back, and the
		// case above fails on its nil error.
		t.Errorf("a start bounded by 2 s still waits after %s", time.Since(began).Round(time.Millisecond))
	}
	t.Logf("declared %s after the start began", time.Since(began).Round(100*time.Millisecond))
	if log.Count("nats: waiting for the NATS cluster's JetStream to declare ", ": no answer: ", "nats.start_timeout 40s") == 0 {
		t.Errorf("no line said what the start waited for:\n%s", log.String())
	}

	// An error no election explains fails at once, in the start's wait
	// too: a stream whose subjects another one takes.
	// Its error is the server's, not the start's bound, and comes well
	// before the 40 s bound ends (5 s, for a busy machine).
	began = time.Now()
	_, err = EnsureStream(ctx, b.JetStream(), jetstream.StreamConfig{Name: "START_WAIT_OTHER", Subjects: []string{"startwait.x"}, Replicas: 3})
	if err == nil || !strings.Contains(err.Error(), "overlap") || strings.Contains(err.Error(), "start_timeout") || time.Since(began) > 5*time.Second {
		t.Errorf("a stream whose subjects overlap another's: %v after %s, want its error at once", err, time.Since(began))
	}
}

// A declaration the server's permissions deny is dropped unanswered, as
// an election's would be; it fails after one try, saying so.
func TestStartDoesNotWaitOutADeniedDeclaration(t *testing.T) {
	ctx := context.Background()
	srv := testutil.StartNATSServer(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoSigs: true, NoLog: true, Users: []*server.User{{Username: "gw", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.STREAM.CREATE.DENIED"}}}}}})
	url := strings.Replace(srv.ClientURL(), "nats://", "nats://gw:pw@", 1)
	b, err := Start(ctx, config.NATS{URL: url, StartTimeout: time.Minute}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	began := time.Now()
	_, err = EnsureStream(ctx, b.JetStream(), jetstream.StreamConfig{Name: "DENIED"})
	if err == nil || !strings.Contains(err.Error(), "permissions violation") || time.Since(began) > 7*time.Second {
		t.Fatalf("a denied declaration: %v after %s, want the permissions violation after one try", err, time.Since(began))
	}
}

// A NATS server without JetStream answered no JetStream request, as one
// still starting does, and the start waited the whole nats.start_timeout
// (60 s) to blame an election; it had failed at once. Its INFO says it
// runs none: the start fails at once, saying so.
func TestStartDoesNotWaitForAServerWithoutJetStream(t *testing.T) {
	ctx := context.Background()
	srv := testutil.StartNATSServer(t, &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true})
	b, err := Start(ctx, config.NATS{URL: srv.ClientURL(), StartTimeout: time.Minute}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	began := time.Now()
	_, err = EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "NO_JETSTREAM"})
	if err == nil || !strings.Contains(err.Error(), "does not run JetStream") || time.Since(began) > 7*time.Second {
		t.Fatalf("a server without JetStream: %v after %s, want it named at once", err, time.Since(began))
	}
}
