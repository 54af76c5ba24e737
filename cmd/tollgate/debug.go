package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// serveDebug serves Go's pprof handlers on their own listener, never on the
// public one: profiles carry request data, and a profile taken under load
// must not compete with the load for the API's connections.
func serveDebug(addr string, logf func(string, ...any)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("server.debug_listen (TOLLGATE_DEBUG_LISTEN in gateway.yaml): %w", err)
	}
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
