package broker

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func startEmbeddedBroker(t *testing.T, dataDir string) *Broker {
	t.Helper()
	b, err := Start(testContext(t), config.NATS{EmbeddedListen: "127.0.0.1:0", Replicas: 3}, dataDir, t.Logf)
	if err != nil {
		t.Fatalf("starting embedded broker: %v", err)
	}
	return b
}

func TestEmbeddedListensOnRandomPortAndServesJetStream(t *testing.T) {
	ctx := testContext(t)
	dataDir := t.TempDir()
	b := startEmbeddedBroker(t, dataDir)
	defer b.Close()

	if !b.Embedded() {
		t.Fatal("Embedded() = false with an empty URL")
	}
	if b.Replicas() != 1 {
		t.Errorf("Replicas() = %d on the embedded server, want 1", b.Replicas())
	}
	if _, err := os.Stat(filepath.Join(dataDir, "nats")); err != nil {
		t.Errorf("store dir: %v", err)
	}

	// Another process reaches the embedded server over TCP through ClientURL.
	other, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatalf("connecting to %s: %v", b.ClientURL(), err)
	}
	defer other.Close()
	if other.ConnectedUrl() == "nats://127.0.0.1:4222" {
		t.Errorf("port 0 gave the default port, want a random one")
	}

	st, err := EnsureStream(ctx, b.JetStream(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second call with the same config succeeds.
	if _, err := EnsureStream(ctx, b.JetStream(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	otherJS, err := jetstream.New(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherJS.Publish(ctx, "t.x", []byte("hello")); err != nil {
		t.Fatalf("publishing through the TCP client: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

func TestEmbeddedRestartKeepsKV(t *testing.T) {
	ctx := testContext(t)
	dataDir := t.TempDir()
	cfg := jetstream.KeyValueConfig{Bucket: "RESTART_TEST", History: 1}

	b := startEmbeddedBroker(t, dataDir)
	kv, err := EnsureKV(ctx, b.JetStream(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	b.Close()

	b = startEmbeddedBroker(t, dataDir)
	defer b.Close()
	kv, err = EnsureKV(ctx, b.JetStream(), cfg)
	if err != nil {
		t.Fatalf("EnsureKV on the existing bucket: %v", err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil {
		t.Fatalf("value lost across restart: %v", err)
	}
	if string(e.Value()) != "kept" {
		t.Errorf("value = %q, want kept", e.Value())
	}
}

func TestExternalURL(t *testing.T) {
	ctx := testContext(t)
	srv := testutil.StartNATSServer(t, &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
	})

	dataDir := t.TempDir()
	b, err := Start(ctx, config.NATS{URL: srv.ClientURL(), Replicas: 1}, dataDir, nil)
	if err != nil {
		t.Fatalf("connecting to the external server: %v", err)
	}
	defer b.Close()
	if b.Embedded() {
		t.Error("Embedded() = true with a URL")
	}
	if _, err := os.Stat(filepath.Join(dataDir, "nats")); !os.IsNotExist(err) {
		t.Errorf("external mode created a local store dir (stat err %v)", err)
	}
	kv, err := EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "EXTERNAL_TEST"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	// The value went to the external server, not to some local one.
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv2, err := js.KeyValue(ctx, "EXTERNAL_TEST")
	if err != nil {
		t.Fatalf("bucket not on the external server: %v", err)
	}
	if e, err := kv2.Get(ctx, "k"); err != nil || string(e.Value()) != "v" {
		t.Errorf("external server has k = %v, %v; want v", e, err)
	}
}

func TestExternalURLUnreachableFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// A listener that is closed again leaves a port nobody answers on.
	srv, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true})
	go srv.Start()
	srv.ReadyForConnections(5 * time.Second)
	url := srv.ClientURL()
	srv.Shutdown()
	srv.WaitForShutdown()

	if b, err := Start(ctx, config.NATS{URL: url}, t.TempDir(), nil); err == nil {
		b.Close()
		t.Fatal("Start succeeded against a server that is down")
	}
}

func TestEmbeddedBadListen(t *testing.T) {
	if b, err := Start(testContext(t), config.NATS{EmbeddedListen: "no-port"}, t.TempDir(), nil); err == nil {
		b.Close()
		t.Fatal("Start accepted embedded_listen without a port")
	}
}

// TestRedactURLs: an error that quotes nats.url must not carry its
// password, or a token given as the user, with or without a scheme, and
// whether or not the URL parses.
func TestRedactURLs(t *testing.T) {
	list := "nats://gateway:gwpass123@10.0.0.1:4222,nats://s3cr3ttoken@10.0.0.2:4222, nats://10.0.0.3:4222"
	got := RedactURLs("connecting to nats at "+list+": no servers", list)
	want := "connecting to nats at nats://xxxxx@10.0.0.1:4222,nats://xxxxx@10.0.0.2:4222, nats://10.0.0.3:4222: no servers"
	if got != want {
		t.Errorf("RedactURLs = %q, want %q", got, want)
	}
	for _, u := range []string{"nats://alice:pa/ssw0rd@127.0.0.1:4222", "alice:s3cretPW@127.0.0.1:4222", "nats://user:p%zz@host:4222"} {
		msg := fmt.Sprintf("connecting to nats at %s: parse %q: invalid", u, u)
		if got := RedactURLs(msg, u); strings.Contains(got, "pa/ssw0rd") || strings.Contains(got, "s3cretPW") || strings.Contains(got, "p%zz") {
			t.Errorf("%s: %q keeps the password", u, got)
		}
	}
}

// TestPublishOrReadAgreesOnTheFirstValue: of processes starting together,
// each publishing a value of its own, one wins and all are given its
// value; a later one is given it too, and a value deleted on purpose is
// replaced by the next one published.
func TestPublishOrReadAgreesOnTheFirstValue(t *testing.T) {
	ctx := testContext(t)
	b := startEmbeddedBroker(t, t.TempDir())
	defer b.Close()
	kv, err := EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "PUBLISH_TEST", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	const starters = 8
	got := make(chan string, starters)
	for i := range starters {
		go func() {
			v, err := PublishOrRead(ctx, kv, "k", []byte(fmt.Sprint("value-", i)))
			if err != nil {
				t.Error(err)
			}
			got <- string(v)
		}()
	}
	first := <-got
	for range starters - 1 {
		if v := <-got; v != first {
			t.Fatalf("starters given %q and %q", first, v)
		}
	}
	if v, err := PublishOrRead(ctx, kv, "k", []byte("late")); err != nil || string(v) != first {
		t.Fatalf("a later start: %q, %v; want %q", v, err, first)
	}
	if err := kv.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if v, err := PublishOrRead(ctx, kv, "k", []byte("replaced")); err != nil || string(v) != "replaced" {
		t.Fatalf("after the value was deleted: %q, %v; want replaced", v, err)
	}
}

// A taken nats.embedded_listen fails the start at once, naming the
// setting: nats-server logged it as fatal, and the start waited 10 s to
// end with "not ready after 10s (port in use, or …)".
func TestEmbeddedListenTakenFailsAtOnceNamingTheSetting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	start := time.Now()
	b, err := Start(testContext(t), config.NATS{EmbeddedListen: ln.Addr().String()}, t.TempDir(), t.Logf)
	if err == nil {
		b.Close()
		t.Fatal("Start took a port already listened on")
	}
	// 5 s: well under the 10 s wait it replaced, with room for a loaded
	// runner's slow start of the server.
	if took := time.Since(start); took > 5*time.Second || !strings.Contains(err.Error(), "nats.embedded_listen (TOLLGATE_NATS_LISTEN") {
		t.Errorf("after %s: %v; want at once, naming nats.embedded_listen (TOLLGATE_NATS_LISTEN)", took, err)
	}
}
