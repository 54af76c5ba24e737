package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"golang.org/x/net/netutil"

	"github.com/tollgate/tollgate/internal/rawconn"
	"github.com/tollgate/tollgate/proxy"
)

// serveDebug serves Go's pprof handlers on their own listener, never on the
// public one: profiles carry request data, and a profile taken under load
// must not compete with the load for the API's connections.
func serveDebug(addr string, logf func(string, ...any)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server.debug_listen (TOLLGATE_DEBUG_LISTEN in gateway.yaml): %w", err)
	}
	ln = sideListener(ln, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	logf("pprof on http://%s/debug/pprof/", ln.Addr())
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// serveMetrics serves GET /metrics, /healthz and /readyz on
// server.metrics_listen, a listener of their own: the metrics need no
// key and name upstreams, models and the billing backlog, and the public
// listener is where clients call, so it could not be kept private. The
// proxy then serves no /metrics on the public one. Closing ln ends it.
// Its /readyz goes on answering while the public listener drains, which
// closed at once takes no probe.
func serveMetrics(ln net.Listener, srv *proxy.Server, logf func(string, ...any)) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", proxy.MetricsContentType)
		_, _ = w.Write(srv.MetricsText())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, proxy.HealthzBody)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		status, body := srv.Readiness()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}
	logf("metrics on http://%s/metrics", ln.Addr())
	go func() { _ = hs.Serve(ln) }()
}

// sideListener caps the connections ln serves at once at share/16 of the
// descriptors kept from the API's clients (rawconn.SideListenerCap);
// those past it wait in the kernel's backlog, holding no descriptor of
// the process. A listener other than the API one, uncapped, let idle
// connections take every descriptor, and the embedded NATS server failed
// its writes until a restart.
func sideListener(ln net.Listener, share uint64) net.Listener {
	limit, ok := rawconn.DescriptorLimit()
	return netutil.LimitListener(ln, rawconn.SideListenerCap(limit, ok, share))
}
