package proxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/tollgate/tollgate/config"
)

// Egress through an HTTP proxy, as Go programs (net/http) and curl take
// it from the environment: HTTPS_PROXY (or https_proxy) for https
// upstreams, with NO_PROXY (no_proxy) naming the hosts dialled directly,
// and loopback hosts never proxied. A connection to an https upstream
// goes through an HTTP CONNECT tunnel, TLS to the upstream inside it.
// The gateway dialled every upstream itself, and behind an egress proxy
// every hosted provider was "unreachable", the proxy never named.
//
// http upstreams are always dialled directly: they are the replicas on
// the gateway's own network (vLLM, SGLang), which HTTP_PROXY, set for
// other programs, would have sent out through the proxy; and most proxies
// refuse a CONNECT to any port but 443.

// egressEnvironment is the proxy configuration upstreams are built with,
// read from the environment once, as net/http does. Tests replace it.
var egressEnvironment = sync.OnceValue(httpproxy.FromEnvironment)

// egress is the HTTP proxy an upstream's connections go through.
type egress struct {
	addr string // the proxy's host:port
	// name is the proxy's URL without its credentials: the log names the
	// proxy, never its password.
	name string
	// request is the whole CONNECT request for the upstream's address,
	// Proxy-Authorization included when the proxy's URL has credentials.
	request []byte
}

// egressFor is the proxy for the upstream at target (its base_url) and
// addr (its host:port), nil when it is dialled directly. bypassed is the
// HTTP_PROXY an http upstream is dialled without, for the log to say so.
func egressFor(env *httpproxy.Config, target *url.URL, addr string) (eg *egress, bypassed string, err error) {
	if target.Scheme != "https" {
		if p, _ := env.ProxyFunc()(target); p != nil {
			return nil, redactedProxy(p), nil
		}
		return nil, "", nil
	}
	if env.HTTPSProxy == "" {
		return nil, "", nil
	}
	// httpproxy drops a value it cannot parse, and the upstream went
	// direct without a word. The value is not quoted: it may hold a
	// password.
	if _, err := parseProxyURL(env.HTTPSProxy); err != nil {
		return nil, "", errors.New("HTTPS_PROXY (or https_proxy) is not a proxy URL such as http://proxy.example:3128")
	}
	p, err := env.ProxyFunc()(target)
	if err != nil || p == nil { // NO_PROXY, or a loopback host
		return nil, "", err
	}
	if p.Scheme != "http" {
		return nil, "", fmt.Errorf("HTTPS_PROXY (or https_proxy) names %s, a %s:// proxy: only http:// proxies (HTTP CONNECT) are supported; "+
			"name one, or list the upstream's host in NO_PROXY to dial it directly", redactedProxy(p), p.Scheme)
	}
	eg = &egress{addr: p.Host, name: redactedProxy(p)}
	if p.Port() == "" {
		eg.addr = net.JoinHostPort(p.Hostname(), "80")
	}
	eg.request = append(eg.request, "CONNECT "+addr+" HTTP/1.1\r\nHost: "+addr+"\r\nUser-Agent: tollgate\r\n"...)
	if p.User != nil {
		password, _ := p.User.Password()
		eg.request = append(eg.request, "Proxy-Authorization: Basic "+base64.StdEncoding.EncodeToString([]byte(p.User.Username()+":"+password))+"\r\n"...)
	}
	eg.request = append(eg.request, "\r\n"...)
	return eg, "", nil
}

// CheckEgress answers what serve, and a reload that adds an https
// upstream, refuse cfg's upstreams for in the HTTPS_PROXY of the
// environment as it is now: a value that is no proxy URL, or a proxy
// that is not http://, named without its credentials, in their words.
// config check said ok, and serve then exited on it. Every upstream
// refused is named.
func CheckEgress(cfg *config.Config) error {
	env := httpproxy.FromEnvironment()
	var errs []error
	for _, uc := range cfg.Upstreams {
		u, err := url.Parse(uc.BaseURL)
		if err != nil {
			continue // config.Load refuses it, in its own words
		}
		if _, _, err := egressFor(env, u, upstreamAddr(u)); err != nil {
			errs = append(errs, fmt.Errorf("upstream %s: %w", uc.Name, err))
		}
	}
	return errors.Join(errs...)
}

// parseProxyURL reads a proxy's address as net/http does: one without a
// scheme ("proxy:3128") is an http:// one. Unlike net/http, a URL that
// does not parse is an error, not "http://" glued before it.
func parseProxyURL(s string) (*url.URL, error) {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Host != "" {
		return u, nil
	}
	if !strings.Contains(s, "://") {
		if u, err := url.Parse("http://" + s); err == nil && u.Host != "" {
			return u, nil
		}
	}
	return nil, errors.New("not a proxy URL")
}

// redactedProxy is p's URL without its user and password.
func redactedProxy(p *url.URL) string {
	return (&url.URL{Scheme: p.Scheme, Host: p.Host}).String()
}

// tunnel opens a connection to addr through the proxy by deadline: the
// TCP connect to the proxy and its answer to CONNECT. took is how long
// that answer took, about a round trip to the upstream: the proxy
// answers once its own connection to the upstream is open. Once ctx is
// done, it gives up.
func (eg *egress) tunnel(ctx context.Context, addr string, deadline time.Time, timeout time.Duration) (net.Conn, time.Duration, error) {
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(ctx, "tcp", eg.addr)
	if err != nil {
		return nil, 0, &connectError{step: "egress proxy " + eg.name, reason: "the egress proxy is unreachable: " + reasonForClient(err), err: err}
	}
	// The proxy's answer may take until deadline: a deadline passed ends
	// the wait once ctx is done.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	took, err := eg.connect(c, addr, deadline, timeout)
	if !stop() && err == nil {
		err = &connectError{step: "CONNECT " + addr + " through egress proxy " + eg.name, err: context.Cause(ctx)}
	}
	if err != nil {
		_ = c.Close()
		return nil, 0, err
	}
	return c, took, nil
}

// connect asks the proxy on c for a tunnel to addr, by deadline.
func (eg *egress) connect(c net.Conn, addr string, deadline time.Time, timeout time.Duration) (time.Duration, error) {
	step := "CONNECT " + addr + " through egress proxy " + eg.name
	if err := c.SetDeadline(deadline); err != nil {
		return 0, &connectError{step: step, err: err}
	}
	start := time.Now()
	if _, err := c.Write(eg.request); err != nil {
		return 0, &connectError{step: step, reason: "the egress proxy closed the connection", err: err}
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	switch {
	case err != nil && isTimeout(err):
		return 0, &connectError{step: step, reason: "the egress proxy did not answer in time",
			err: fmt.Errorf("no answer within connect_timeout (%s)", timeout)}
	case err != nil:
		return 0, &connectError{step: step, reason: "the egress proxy's answer to CONNECT is not HTTP", err: err}
	case resp.StatusCode/100 != 2:
		// 407: its credentials are missing or wrong; 403: its policy
		// refuses the host; 502, 504: it could not reach the upstream.
		return 0, &connectError{step: step, err: fmt.Errorf("it answered %s", resp.Status),
			reason: fmt.Sprintf("the egress proxy refused the tunnel (%d %s)", resp.StatusCode, http.StatusText(resp.StatusCode))}
	case br.Buffered() > 0:
		// The upstream speaks only after the TLS client's hello: these
		// are the proxy's, and would be taken for the upstream's.
		return 0, &connectError{step: step, reason: "the egress proxy's answer to CONNECT is not HTTP",
			err: fmt.Errorf("it sent %d bytes after its answer %s", br.Buffered(), resp.Status)}
	}
	took := time.Since(start)
	if err := c.SetDeadline(time.Time{}); err != nil {
		return 0, &connectError{step: step, err: err}
	}
	return took, nil
}
