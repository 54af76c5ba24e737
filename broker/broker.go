// Package broker connects Tollgate to NATS: either an in-process nats-server
// with JetStream stored under data_dir (the single-machine default) or an
// external cluster. Streams and KV buckets are declared by the packages that
// own them through EnsureStream and EnsureKV.
package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/config"
)

const (
	clientName    = "tollgate"
	reconnectWait = 250 * time.Millisecond
	readyTimeout  = 10 * time.Second
	drainTimeout  = 5 * time.Second
)

// Broker is one NATS client connection, plus the embedded server behind it
// when Tollgate runs its own.
type Broker struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	embedded *server.Server // nil with an external NATS
	storeDir string         // the embedded server's, data_dir/nats
	watch    *storeWatch    // nil with an external NATS
	connLog  *connLog       // nil without a logf
	replicas int
	closed   chan struct{} // closed by the client's ClosedHandler
}

// Start runs an embedded nats-server when cfg.URL is empty, otherwise
// connects to cfg.URL. logf receives the embedded server's notices, warnings
// and errors, and client connection events; nil keeps both silent.
//
// The embedded server has no authentication: keep embedded_listen on a
// loopback address.
func Start(ctx context.Context, cfg config.NATS, dataDir string, logf func(string, ...any)) (*Broker, error) {
	return StartWith(ctx, cfg, dataDir, logf, DiskSync{})
}

// DiskSync says how often the embedded server writes JetStream's files to
// disk. It matters only for a power loss or kernel crash: what JetStream
// acknowledged is in the page cache at once, and survives a killed process.
type DiskSync struct {
	// Interval between fsyncs; 0 keeps nats-server's default, 2 minutes.
	Interval time.Duration
	// Always fsyncs every message before it is acknowledged.
	Always bool
}

// StartWith is Start with the embedded server's disk sync set; an external
// server keeps its own (its sync_interval setting).
func StartWith(ctx context.Context, cfg config.NATS, dataDir string, logf func(string, ...any), sync DiskSync) (*Broker, error) {
	b := &Broker{replicas: max(cfg.Replicas, 1), closed: make(chan struct{})}
	startTimeout := cmp.Or(cfg.StartTimeout, config.DefaultNATSStartTimeout)
	url := cfg.URL
	var opts []nats.Option
	if url == "" {
		srv, err := startEmbedded(cfg, dataDir, logf, sync)
		if err != nil {
			return nil, err
		}
		b.embedded = srv
		b.storeDir = filepath.Join(dataDir, "nats")
		url = srv.ClientURL()
		if b.replicas > 1 && logf != nil {
			logf("nats: replicas %d needs a cluster; the embedded server stores 1 copy", b.replicas)
		}
		b.replicas = 1
		// The embedded server is in this process; no need to go through TCP.
		opts = append(opts, nats.InProcessServer(srv))
	} else {
		if cfg.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(cfg.CredsFile))
		}
		if cfg.TLSCA != "" {
			opts = append(opts, nats.RootCAs(cfg.TLSCA))
		}
		if cfg.TLSCert != "" || cfg.TLSKey != "" {
			opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
		}
	}
	opts = append(opts,
		nats.Name(clientName),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ClosedHandler(func(*nats.Conn) { close(b.closed) }),
	)
	if logf != nil {
		// Through one connLog: a server refusing every reconnection
		// sends its error each time, about once a second.
		cl := newConnLog(logf, connLogEvery)
		b.connLog = cl
		opts = append(opts,
			nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
				if sub != nil {
					cl.printf("nats: subscription %s: %v", sub.Subject, err)
					return
				}
				cl.printf("nats: %v", err)
			}),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					cl.printf("nats: disconnected: %v", err)
				}
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) { cl.printf("nats: reconnected to %s", nc.ConnectedUrlRedacted()) }),
		)
	} else {
		// nats.go's default handler writes to stderr.
		opts = append(opts, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) > 0 {
		opts = append(opts, nats.Timeout(time.Until(deadline)))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		b.closeConnLog()
		b.shutdownEmbedded()
		// nats.go's own error may quote the URL too (one that does not
		// parse): the whole message is redacted, not only the list.
		return nil, redactedError{msg: RedactURLs(fmt.Sprintf("connecting to nats at %s: %v", url, err), url), err: err}
	}
	b.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("opening jetstream: %w", err)
	}
	b.js = &startJetStream{JetStream: js, wait: &startWait{
		until:   time.Now().Add(startTimeout),
		timeout: startTimeout,
		logf:    logf,
	}}
	if b.embedded != nil {
		watchLog := logf
		if watchLog == nil {
			watchLog = func(string, ...any) {}
		}
		b.watch = startStoreWatch(b.embedded, b.storeDir, watchLog, nc.ForceReconnect)
	}
	return b, nil
}

func startEmbedded(cfg config.NATS, dataDir string, logf func(string, ...any), sync DiskSync) (*server.Server, error) {
	listen := cfg.EmbeddedListen
	if listen == "" {
		listen = config.DefaultEmbeddedListen
	}
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("nats.embedded_listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("nats.embedded_listen %q: port must be 0-65535", listen)
	}
	if port == 0 {
		// nats-server reads 0 as "default port 4222"; -1 asks for a free one.
		port = server.RANDOM_PORT
	} else if ln, err := net.Listen("tcp", listen); err != nil {
		// Tried first: nats-server logs a taken port as fatal and gives
		// up, and the start waited its readyTimeout (10 s) to end with a
		// guess among causes, naming no setting.
		return nil, fmt.Errorf("listening on nats.embedded_listen (TOLLGATE_NATS_LISTEN in gateway.yaml) %s: %w", listen, err)
	} else {
		ln.Close()
	}
	storeDir := filepath.Join(dataDir, "nats")
	if err := os.MkdirAll(storeDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating nats store dir: %w", err)
	}
	opts := &server.Options{
		ServerName: "tollgate-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true, // signals belong to the tollgate process, not to the server
		NoLog:      logf == nil,

		SyncInterval: sync.Interval,
		SyncAlways:   sync.Always,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configuring embedded nats: %w", err)
	}
	if logf != nil {
		srv.SetLogger(serverLogger(logf), false, false)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("embedded nats on %s not ready after %s (nats.embedded_listen taken since it was tried, or %s not writable?)", listen, readyTimeout, storeDir)
	}
	return srv, nil
}

// Conn is the shared client connection.
func (b *Broker) Conn() *nats.Conn { return b.nc }

// JetStream is the JetStream context of Conn.
func (b *Broker) JetStream() jetstream.JetStream { return b.js }

// RedactURLs hides the credentials of a comma-separated list of NATS URLs
// in text (the list itself, or an error that quotes it): the user info of
// each (user and password, the part before its last "@") becomes xxxxx,
// with or without a scheme, whether or not the URL parses. An error that
// quoted nats.url wrote the password to the log at every failed start.
func RedactURLs(text, list string) string {
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		at := strings.LastIndex(p, "@")
		if at < 0 {
			continue
		}
		from := 0
		if i := strings.Index(p, "://"); i >= 0 && i < at {
			from = i + 3
		}
		if info := p[from:at]; info != "" {
			text = strings.ReplaceAll(text, info, "xxxxx")
		}
	}
	return text
}

// redactedError is err with a message whose credentials are hidden; errors.Is
// still sees err.
type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }

// ClientURL is where other processes (`tollgate billing`, nats tools, tests)
// reach the embedded server; with an external NATS it is the URL connected to.
func (b *Broker) ClientURL() string {
	if b.embedded != nil {
		return b.embedded.ClientURL()
	}
	return b.nc.ConnectedUrlRedacted()
}

// Replicas is the replica count for streams and KV buckets: the configured
// one with an external NATS, always 1 with the embedded server.
func (b *Broker) Replicas() int { return b.replicas }

// Embedded reports whether this broker runs its own nats-server.
func (b *Broker) Embedded() bool { return b.embedded != nil }

// Close drains the client, so published messages and pending acks are
// flushed, then stops the embedded server and waits until it has stopped.
// Close everything using Conn or JetStream (watchers, consumers) first.
func (b *Broker) Close() {
	if b.watch != nil {
		b.watch.close()
	}
	if b.nc != nil {
		// Draining a connection that is down would only wait out the timeout.
		if b.nc.IsConnected() && b.nc.Drain() == nil {
			select {
			case <-b.closed:
			case <-time.After(drainTimeout):
			}
		}
		b.nc.Close()
	}
	b.closeConnLog()
	b.shutdownEmbedded()
}

// closeConnLog writes the connection's line held back, if any: none is
// written after.
func (b *Broker) closeConnLog() {
	if b.connLog != nil {
		b.connLog.close()
	}
}

func (b *Broker) shutdownEmbedded() {
	if b.embedded != nil {
		b.embedded.Shutdown()
		b.embedded.WaitForShutdown()
	}
}

// EnsureKV creates the bucket or updates its configuration to cfg. It is
// idempotent, so every process can call it at start-up; at start, through
// a broker's JetStream, it waits out an election (see declareAtStart).
func EnsureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := declareAtStart(ctx, js, "kv bucket "+cfg.Bucket, func(ctx context.Context) (jetstream.KeyValue, error) {
		cfg := cfg
		// A process started with a smaller nats.replicas (say a billing
		// consumer on the default file) must not shrink a cluster's R3
		// bucket; nor may one whose look was not answered.
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if _, election := electionExplains(err); election {
			return nil, err
		}
		if err == nil {
			if st, err := kv.Status(ctx); err == nil {
				if info, ok := st.(*jetstream.KeyValueBucketStatus); ok && info.StreamInfo().Config.Replicas > cfg.Replicas {
					cfg.Replicas = info.StreamInfo().Config.Replicas
				}
			}
		}
		return js.CreateOrUpdateKeyValue(ctx, cfg)
	})
	if err != nil {
		return nil, fmt.Errorf("ensuring kv bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// PublishOrRead publishes value under key unless a value is there already,
// and returns the value that is there: value, or the one another process
// published first. It is how the gateways of a deployment check at start
// that they share a secret (the signing key, the console secret): the
// first to start publishes a digest of its own, and each later one
// compares. Of processes starting together exactly one value wins, and
// every one of them is given that one. A key deleted by an operator (to
// replace the secret on purpose) is published again.
func PublishOrRead(ctx context.Context, kv jetstream.KeyValue, key string, value []byte) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		_, err := kv.Create(ctx, key, value)
		if err == nil {
			return value, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("publishing %s in %s: %w", key, kv.Bucket(), err)
		}
		entry, err := kv.Get(ctx, key)
		// Deleted between the two calls: publish again, a few times at
		// most.
		if errors.Is(err, jetstream.ErrKeyNotFound) && attempt < 3 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s in %s: %w", key, kv.Bucket(), err)
		}
		return entry.Value(), nil
	}
}

// EnsureStream creates the stream or updates its configuration to cfg. It is
// idempotent, so every process can call it at start-up; at start, through
// a broker's JetStream, it waits out an election (see declareAtStart).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := declareAtStart(ctx, js, "stream "+cfg.Name, func(ctx context.Context) (jetstream.Stream, error) {
		cfg := cfg
		existing, err := js.Stream(ctx, cfg.Name)
		if _, election := electionExplains(err); election {
			return nil, err // an unanswered look must not shrink it, as in EnsureKV
		}
		if err == nil && existing.CachedInfo().Config.Replicas > cfg.Replicas {
			cfg.Replicas = existing.CachedInfo().Config.Replicas
		}
		return js.CreateOrUpdateStream(ctx, cfg)
	})
	if err != nil {
		return nil, fmt.Errorf("ensuring stream %s: %w", cfg.Name, err)
	}
	return st, nil
}

// serverLogger routes nats-server's log lines to logf.
type serverLogger func(string, ...any)

func (l serverLogger) Noticef(format string, v ...any) { l("nats: "+format, v...) }
func (l serverLogger) Warnf(format string, v ...any)   { l("nats warning: "+format, v...) }
func (l serverLogger) Fatalf(format string, v ...any)  { l("nats fatal: "+format, v...) }
func (l serverLogger) Errorf(format string, v ...any)  { l("nats error: "+format, v...) }
func (l serverLogger) Debugf(string, ...any)           {}
func (l serverLogger) Tracef(string, ...any)           {}

var _ server.Logger = serverLogger(nil)
