package testutil

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartNATSCluster runs n routed nats-servers with JetStream on loopback,
// in this process, each with its own store in a test dir, and waits for a
// JetStream meta leader that sees every node. It returns the servers and
// their client URLs; the test's cleanup shuts down those still running.
func StartNATSCluster(t testing.TB, n int) ([]*server.Server, []string) {
	t.Helper()
	// FreePort's ports are free when picked, not when bound: another
	// package's test, run at the same time, can take one first, and that
	// node never listens ("NATS server n2 not ready" in a make test run).
	// The whole cluster is started again on new ports then.
	for attempt := 1; ; attempt++ {
		servers, urls, err := tryNATSCluster(t, n)
		if err == nil {
			return servers, urls
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("starting a NATS cluster again on other ports: %v", err)
	}
}

// tryNATSCluster is one try of StartNATSCluster: the nodes it started are
// shut down when it fails.
func tryNATSCluster(t testing.TB, n int) ([]*server.Server, []string, error) {
	t.Helper()
	clientPorts, routePorts := make([]int, n), make([]int, n)
	var routes, urls []string
	for i := range n {
		clientPorts[i], routePorts[i] = FreePort(t), FreePort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i]))
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]))
	}
	var servers []*server.Server
	var options []*server.Options
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       clientPorts[i],
			JetStream:  true,
			StoreDir:   t.TempDir(),
			Cluster:    server.ClusterOpts{Name: "tollgate-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
			NoSigs:     true,
			NoLog:      true,
		}
		srv, err := startNATS(opts.Clone())
		if err != nil {
			for _, started := range servers {
				started.Shutdown()
				started.WaitForShutdown()
			}
			return nil, nil, err
		}
		servers, options = append(servers, srv), append(options, opts)
	}
	for i, srv := range servers {
		keepNATSNode(t, srv, options[i])
	}
	// A meta leader alone is not enough: until it has every node's stats,
	// a bucket of n replicas is refused "no suitable peers for placement,
	// peer offline" (a make test run met it).
	ready := func(srv *server.Server) bool { return srv.JetStreamIsLeader() && len(srv.JetStreamClusterPeers()) == n }
	for deadline := time.Now().Add(30 * time.Second); !slices.ContainsFunc(servers, ready); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no JetStream meta leader seeing all %d nodes after 30 s", n)
		}
	}
	return servers, urls, nil
}

// nodeOptions holds the options each node of StartNATSCluster was started
// with, so RestartNATSNode can start it again as it was.
var nodeOptions sync.Map // *server.Server -> *server.Options

// keepNATSNode has the test's cleanup shut down srv, started by startNATS
// with opts, and RestartNATSNode able to start it again.
func keepNATSNode(t testing.TB, srv *server.Server, opts *server.Options) {
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	nodeOptions.Store(srv, opts)
	t.Cleanup(func() { nodeOptions.Delete(srv) })
}

// StartNATSServer runs a nats-server with opts in this process, waits
// until it takes connections, and has the test's cleanup shut it down.
func StartNATSServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	srv, err := startNATS(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// startNATS runs a nats-server with opts in this process and waits until
// it takes connections; one that does not is shut down.
func startNATS(opts *server.Options) (*server.Server, error) {
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("NATS server %s not ready", opts.ServerName)
	}
	return srv, nil
}

// RestartNATSNode starts node srv of StartNATSCluster again, on its ports
// and its store, after the test shut it down (it is shut down first if
// not), and returns the new server; it rejoins the cluster as the node
// that was lost. It does not wait for a meta leader.
func RestartNATSNode(t testing.TB, srv *server.Server) *server.Server {
	t.Helper()
	opts, ok := nodeOptions.Load(srv)
	if !ok {
		t.Fatal("RestartNATSNode: not a node of StartNATSCluster")
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	next, err := startNATS(opts.(*server.Options).Clone())
	if err != nil {
		t.Fatal(err)
	}
	keepNATSNode(t, next, opts.(*server.Options))
	return next
}

// FreePort is a TCP port on 127.0.0.1 that nothing listens on now, for a
// server a test must start on a port it names (a config file, a restart on
// the same address).
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
