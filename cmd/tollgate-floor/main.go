// Command tollgate-floor runs the reference hops make bench compares
// Tollgate with, besides nginx: Go proxies that relay bytes and do
// nothing else, so the benchmark tells Tollgate's own cost from its
// platform's.
//
//	-mode fasthttp   fasthttp's server and HostClient and nothing else: the
//	                 floor of the platform Tollgate is built on
//	-mode epoll      one locked thread running its own epoll loop with raw
//	                 system calls, no goroutine per connection (Linux): what
//	                 an event loop of Tollgate's own could reach
//
// Both relay requests as they are (no auth, no metering, no JSON) to one
// upstream over keep-alive connections, and a response's bytes as they
// arrive, so streams are not buffered. They are measuring instruments,
// not proxies to deploy: no TLS, no timeouts, no limits.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "tollgate-floor: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("tollgate-floor", flag.ContinueOnError)
	mode := fs.String("mode", "fasthttp", "fasthttp or epoll")
	addr := fs.String("addr", "127.0.0.1:8090", "listen address")
	upstream := fs.String("upstream", "127.0.0.1:8000", "upstream host:port (plain HTTP/1.1)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", *addr)
	if err != nil {
		return err
	}
	switch *mode {
	case "fasthttp":
		return serveFasthttp(ln, *upstream)
	case "epoll":
		return serveEpoll(ln, *upstream)
	}
	return fmt.Errorf("-mode %q is neither fasthttp nor epoll", *mode)
}
