package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/config"
)

// upstream is one generation server and its connection pool. It is immutable;
// a config reload that changes an upstream builds a new one, and requests in
// flight finish on the old.
type upstream struct {
	cfg          config.Upstream
	chatURL      string
	responsesURL string
	modelsURL    string
	authHeader   string // "Bearer …", empty when no key is configured
	client       *fasthttp.HostClient
}

// idlePoolTime is kept below the 5 s keep-alive of uvicorn (vLLM, SGLang) so
// the pool does not hand out connections the upstream is about to close.
const idlePoolTime = 4 * time.Second

func newUpstream(cfg config.Upstream) (*upstream, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: base_url: %w", cfg.Name, err)
	}
	tls := u.Scheme == "https"
	addr := u.Host
	if u.Port() == "" {
		if tls {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	base := strings.TrimRight(cfg.BaseURL, "/")
	up := &upstream{
		cfg:          cfg,
		chatURL:      base + "/chat/completions",
		responsesURL: base + "/responses",
		modelsURL:    base + "/models",
	}
	if cfg.APIKey != "" {
		up.authHeader = "Bearer " + cfg.APIKey
	}
	up.client = &fasthttp.HostClient{
		Addr:                     addr,
		IsTLS:                    tls,
		Name:                     "tollgate",
		NoDefaultUserAgentHeader: false,
		Dial:                     up.dial,
		MaxConns:                 cfg.MaxConnections,
		MaxConnWaitTimeout:       cfg.FirstByteTimeout,
		MaxIdleConnDuration:      idlePoolTime,
		MaxResponseBodySize:      int(cfg.MaxResponseBody),
		StreamResponseBody:       true,
		ReadBufferSize:           16 << 10,
		DisablePathNormalizing:   true,
		RetryIfErr:               retryStaleConnection,
		// ReadTimeout and WriteTimeout stay zero on purpose: fasthttp's
		// ReadTimeout caps a whole response, which would cut long streams.
		// timeoutConn enforces first-byte and idle timeouts per read.
	}
	return up, nil
}

// retryStaleConnection retries once when a pooled keep-alive connection turns
// out to be closed by the upstream before any response byte arrived; any
// other failure of a POST is not retried, to never generate twice.
func retryStaleConnection(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
	return false, attempts < 2 && (errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed))
}

func (u *upstream) dial(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, u.cfg.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	return &timeoutConn{Conn: c, firstByte: u.cfg.FirstByteTimeout, idle: u.cfg.IdleTimeout, write: u.cfg.WriteTimeout}, nil
}

// timeoutConn owns the deadlines of an upstream connection. After every
// write (a new request) the next read may wait firstByte; each later read
// may wait idle. A stream that keeps producing is therefore never cut, and
// one that stalls is, which fasthttp's whole-response ReadTimeout cannot do.
//
// fasthttp uses a connection from one goroutine at a time, so awaitingFirst
// needs no lock.
type timeoutConn struct {
	net.Conn
	firstByte, idle, write time.Duration
	awaitingFirst          bool
}

func (c *timeoutConn) Write(p []byte) (int, error) {
	c.awaitingFirst = true
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.write)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *timeoutConn) Read(p []byte) (int, error) {
	wait := c.idle
	if c.awaitingFirst {
		wait = c.firstByte
	}
	if err := c.Conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaitingFirst = false
	}
	return n, err
}

// SetReadDeadline and SetWriteDeadline ignore fasthttp's own deadlines; the
// ones set per read and write above are the ones that hold.
func (c *timeoutConn) SetReadDeadline(time.Time) error  { return nil }
func (c *timeoutConn) SetWriteDeadline(time.Time) error { return nil }
func (c *timeoutConn) SetDeadline(time.Time) error      { return nil }

// isTimeout reports whether err came from a read or write deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, fasthttp.ErrTimeout)
}
