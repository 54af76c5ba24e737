package testutil

import (
	"fmt"
	"net"
	"slices"
	"strings"
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
	clientPorts, routePorts := make([]int, n), make([]int, n)
	var routes, urls []string
	for i := range n {
		clientPorts[i], routePorts[i] = freePort(t), freePort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i]))
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]))
	}
	var servers []*server.Server
	for i := range n {
		srv, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       clientPorts[i],
			JetStream:  true,
			StoreDir:   t.TempDir(),
			Cluster:    server.ClusterOpts{Name: "tollgate-test", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
			NoSigs:     true,
			NoLog:      true,
		})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatalf("NATS node n%d not ready", i+1)
		}
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		servers = append(servers, srv)
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
	return servers, urls
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
