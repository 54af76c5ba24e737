package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/rawconn"
)

// The gateway's own HTTP/1.1 client for generation calls. fasthttp's
// HostClient hands a streamed body out one upstream chunk per Read, behind
// a mutex and per-response closures, and gives no way to tell whether more
// of the body has already arrived. Here the body is read straight off the
// connection's buffer, so a relay can send every event that arrived in one
// read from the upstream in one write to the client (as a bare nginx hop
// does) without ever holding back an event that arrived alone.

// errNoFreeConns is returned when max_connections requests to an upstream
// are in flight and none finished within first_byte_timeout. Raise
// upstreams[].max_connections, or add upstreams.
var errNoFreeConns = errors.New("every connection is busy (max_connections reached)")

// connPool keeps an upstream's keep-alive connections.
type connPool struct {
	addr string
	// https: the dialer's connections are TLS, handshake done.
	https bool
	// dialer opens a connection to addr; one whose ctx is done gives up.
	dialer  func(ctx context.Context, addr string) (net.Conn, error)
	maxWait time.Duration

	// busy holds one token per connection in use, this pool's own or,
	// after a reload, its predecessor's (inheritSlots); with idle reused
	// first, no more than cap(busy) connections are ever open.
	busy chan struct{}

	// mu also orders every slot given back (freeSlotLocked) against a
	// reload counting the slots in use (inheritSlots).
	mu      sync.Mutex
	idle    []*upstreamConn // most recently used last
	retired bool            // a reload replaced the upstream: keep nothing idle
	// sweep closes the idle connections idlePoolTime old (sweepIdle);
	// sweepArmed: it will run, and release need not arm it.
	sweep      *time.Timer
	sweepArmed bool
	// heir is the pool of the upstream's settings after a reload, when
	// at the same address; owed is how many of heir's slots still stand
	// for connections of this pool in use (inheritSlots).
	heir *connPool
	owed int

	// overran, when set, is told of an answer its upstream followed with
	// n bytes or more nobody asked for (Close).
	overran func(n int)
}

// upstreamConn is one connection and its read buffer.
type upstreamConn struct {
	conn      net.Conn
	tc        *timeoutConn
	br        *bufio.Reader
	idleSince time.Time
	reused    bool // served a request before: a failure before any byte may be the upstream closing it
	// checked: looked at when taken (rawconn.Quiet) and found open, so a
	// close after the request is the upstream's answer to it, not a
	// keep-alive closed while it sat idle.
	checked bool
	// dialTook is how long the connection's TCP connect took, about a
	// round trip to the upstream: how soon the reset of a request sent on
	// a connection it had already closed comes back.
	dialTook time.Duration
}

func newConnPool(addr string, https bool, maxConns int, maxWait time.Duration, dialer func(context.Context, string) (net.Conn, error)) *connPool {
	return &connPool{addr: addr, https: https, dialer: dialer, maxWait: maxWait, busy: make(chan struct{}, max(maxConns, 1))}
}

// acquire takes a slot and a connection: a kept one, or a new one.
// atOnce: a kept connection on a slot free at once, the common case, in
// which the client was not looked at and need not be. client, when not
// nil, is looked at while the call waits for a slot or a new connection.
func (p *connPool) acquire(client net.Conn) (uc *upstreamConn, atOnce bool, err error) {
	atOnce = true
	select {
	case p.busy <- struct{}{}:
	default:
		if err := p.awaitSlot(client); err != nil {
			return nil, false, err
		}
		atOnce = false
	}
	now := time.Now()
	p.mu.Lock()
	for n := len(p.idle); n > 0; n = len(p.idle) {
		uc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		if idle := now.Sub(uc.idleSince); idle < idlePoolTime {
			p.mu.Unlock()
			uc.checked = idle >= quietCheckIdle && uc.tc != nil
			if !uc.checked || rawconn.Quiet(uc.tc.Conn) {
				return uc, atOnce, nil
			}
		} else {
			p.mu.Unlock()
		}
		_ = uc.conn.Close()
		p.mu.Lock()
	}
	p.mu.Unlock()
	uc, err = p.dialWatching(client)
	if err != nil {
		p.freeSlot()
		return nil, false, err
	}
	return uc, false, nil
}

// awaitSlot waits up to maxWait for a slot, looking at client's
// connection every clientCheckEvery meanwhile: a call that waited for a
// slot without looking went out once one was free, minutes after its
// client had given up, and was generated and billed in full.
func (p *connPool) awaitSlot(client net.Conn) error {
	timeout := time.NewTimer(p.maxWait)
	defer timeout.Stop()
	var look <-chan time.Time
	if client != nil {
		every := time.NewTicker(clientCheckEvery)
		defer every.Stop()
		look = every.C
	}
	for {
		select {
		case p.busy <- struct{}{}:
			return nil
		case <-timeout.C:
			return errNoFreeConns
		case <-look:
			if rawconn.PeerClosed(client) {
				return errClientGoneUnsent
			}
		}
	}
}

// inheritSlots makes p, the pool of an upstream's settings after a
// reload, count the connections prev, its pool before, has in use
// against p's max_connections until they end. A reload that edited a
// timeout or rotated an api_key gave the upstream a whole new cap beside
// its calls still running (and each further edit one more): twice
// max_connections connections, and waiting calls let through. Those to
// another address do not count: they load another server. p must not be
// in use yet.
func (p *connPool) inheritSlots(prev *connPool) {
	if prev.addr != p.addr || prev.https != p.https {
		return
	}
	prev.mu.Lock()
	defer prev.mu.Unlock()
	n := min(len(prev.busy), cap(p.busy))
	for range n {
		p.busy <- struct{}{} // p is not in use: never blocks
	}
	// A previous heir, if any, was built by a reload that failed: it never
	// served, and what it was owed goes with it.
	prev.heir, prev.owed = p, n
}

// freeSlot gives back the slot of a connection no longer in use.
func (p *connPool) freeSlot() {
	p.mu.Lock()
	heir, n := p.freeSlotLocked()
	p.mu.Unlock()
	heir.freeSlots(n)
}

// freeSlotLocked gives back a slot, and answers how many of heir's
// slots are to be given back with it: those inherited for connections of
// p that have ended since. Only when fewer than owed remain in use does
// one go, so that an heir with a smaller cap frees its slots only as p
// comes under it. Lock held on entry: a slot given back outside it could
// be counted by inheritSlots as in use and then never handed on, and the
// heir would have lost it for good.
func (p *connPool) freeSlotLocked() (heir *connPool, n int) {
	<-p.busy
	if p.heir == nil || p.owed <= len(p.busy) {
		return nil, 0
	}
	n = p.owed - len(p.busy)
	p.owed -= n
	return p.heir, n
}

// freeSlots gives back n slots (none on a nil p).
func (p *connPool) freeSlots(n int) {
	for range n {
		p.freeSlot()
	}
}

// dialWatching opens a new connection, looking at client's connection,
// when not nil, every clientCheckEvery while it opens, and once more if
// it fails. A call to a model's only upstream whose connect got no
// answer went on dialling for connect_timeout after its client had left,
// and then counted as the upstream's 503, not the client's 499. Gone,
// the dial is abandoned and the call ends with errClientGoneUnsent. A
// connect done within clientCheckEvery, the common case, looks at
// nothing.
func (p *connPool) dialWatching(client net.Conn) (*upstreamConn, error) {
	if client == nil {
		return p.dial(context.Background())
	}
	ctx, abandon := context.WithCancel(context.Background())
	defer abandon()
	dialed, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		every := time.NewTicker(clientCheckEvery)
		defer every.Stop()
		for {
			select {
			case <-dialed:
				return
			case <-every.C:
				if rawconn.PeerClosed(client) {
					abandon()
					return
				}
			}
		}
	}()
	uc, err := p.dial(ctx)
	close(dialed)
	<-watched // the client is looked at by one goroutine at a time
	if err != nil && (ctx.Err() != nil || rawconn.PeerClosed(client)) {
		return nil, errClientGoneUnsent
	}
	return uc, err
}

func (p *connPool) dial(ctx context.Context) (*upstreamConn, error) {
	start := time.Now()
	conn, err := p.dialer(ctx, p.addr)
	if err != nil {
		return nil, err
	}
	uc := &upstreamConn{conn: conn, br: bufio.NewReaderSize(conn, 16<<10), dialTook: time.Since(start)}
	uc.tc, _ = conn.(*timeoutConn)
	if tlsConn, ok := conn.(*tls.Conn); ok {
		uc.tc, _ = tlsConn.NetConn().(*timeoutConn)
	}
	if uc.tc != nil {
		uc.dialTook = uc.tc.connectTook // the handshake's round trips are not the upstream's reset's
	}
	return uc, nil
}

// quietCheckIdle is how long a kept connection may sit idle before it is
// looked at (rawconn.Quiet, one system call) when taken. An upstream that
// half-closed it while idle (shutdown of its sending side, still reading)
// took the request, worked on it and could not answer: the close read
// right after the write passed for a stale connection, and the request
// was generated again on a new one. One that wrote an unasked answer on
// it (408, Connection: close) had that answer taken for the next call's.
// Under load connections are taken again within milliseconds, and no
// server closes a connection that soon.
const quietCheckIdle = 50 * time.Millisecond

// staleWindow is how soon after a request's write the failure of a
// connection the upstream had closed while idle comes: within a few round
// trips. A failure later is the upstream closing after it took the request,
// which may have been generated.
func (uc *upstreamConn) staleWindow() time.Duration {
	return max(4*uc.dialTook, 10*time.Millisecond)
}

// release gives back a connection whose response was read to its end.
func (p *connPool) release(uc *upstreamConn) {
	if uc.tc != nil {
		uc.tc.client = nil
	}
	uc.reused = true
	uc.idleSince = time.Now()
	var stale *upstreamConn
	p.mu.Lock()
	if p.retired {
		p.mu.Unlock()
		p.discard(uc)
		return
	}
	if len(p.idle) > 0 && uc.idleSince.Sub(p.idle[0].idleSince) >= idlePoolTime {
		// The least recently used one would be handed out only after the
		// upstream's own keep-alive closed it.
		stale = p.idle[0]
		p.idle = append(p.idle[:0], p.idle[1:]...)
	}
	p.idle = append(p.idle, uc)
	if !p.sweepArmed {
		p.armSweepLocked(idlePoolTime)
	}
	heir, n := p.freeSlotLocked()
	p.mu.Unlock()
	heir.freeSlots(n)
	if stale != nil {
		_ = stale.conn.Close()
	}
}

// armSweepLocked has sweepIdle run in d. Lock held on entry.
func (p *connPool) armSweepLocked(d time.Duration) {
	p.sweepArmed = true
	if p.sweep == nil {
		p.sweep = time.AfterFunc(d, p.sweepIdle)
		return
	}
	p.sweep.Reset(d)
}

// sweepIdle closes the idle connections idlePoolTime old, and runs
// again when the oldest left is. Kept, they were never handed out again
// but stayed open until the upstream closed them, up to max_connections
// TLS connections per gateway for an upstream with a long keep-alive;
// closed only as their successors went idle (release) or at a reload, a
// burst's connections stayed open for good once calls stopped. One
// timer a pool, armed by a release that finds it idle, runs at most once
// every idlePoolTime or so while connections come and go.
func (p *connPool) sweepIdle() {
	now := time.Now()
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleSince) >= idlePoolTime {
		n++
	}
	old := slices.Clone(p.idle[:n])
	rest := copy(p.idle, p.idle[n:])
	clear(p.idle[rest:])
	p.idle = p.idle[:rest]
	if rest > 0 {
		p.armSweepLocked(p.idle[0].idleSince.Add(idlePoolTime).Sub(now))
	} else {
		p.sweepArmed = false
	}
	p.mu.Unlock()
	for _, uc := range old {
		_ = uc.conn.Close()
	}
}

// dropIdle closes every idle connection.
func (p *connPool) dropIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, uc := range idle {
		_ = uc.conn.Close()
	}
}

// discard closes a connection that must not be reused: a body not read to
// its end, a broken exchange, or the upstream's Connection: close.
func (p *connPool) discard(uc *upstreamConn) {
	_ = uc.conn.Close()
	p.freeSlot()
}

// retire closes the idle connections of an upstream a reload replaced or
// removed; calls still in flight close theirs when they end.
func (p *connPool) retire() {
	p.mu.Lock()
	p.retired = true // release discards from now on
	p.mu.Unlock()
	p.dropIdle()
}

// upstreamResponse is one response: its header and its body on the
// connection it came on. Close (or reading the body to its end and then
// Close) gives the connection back.
type upstreamResponse struct {
	Header fasthttp.ResponseHeader
	pool   *connPool
	uc     *upstreamConn

	// The body's framing and how far it is read.
	chunked    bool
	untilClose bool  // no length: the body ends when the upstream closes
	left       int64 // bytes left of a sized body, or of the current chunk
	needCRLF   bool  // the CRLF after a chunk's data is still unread
	done       bool  // read to its end
	err        error

	interim int // interim (1xx) responses before the header
	// unsent: the request's write failed, so the upstream did not get it
	// whole.
	unsent bool
}

var upstreamResponsePool = sync.Pool{New: func() any { return new(upstreamResponse) }}

// roundTrip sends req (a whole HTTP/1.1 request) and reads the response
// header. A pooled connection the upstream closed while it sat idle, or
// answered 408 on, is replaced once by a new one; a request that reached
// an upstream which then failed is not sent to it again. firstByte is how long the answer's
// first byte may take (0: first_byte_timeout). client, when not nil, is
// the connection of the client waiting: a long wait ends with
// errClientGone once it closes.
//
// The client is also looked at before the request goes out, unless it
// goes out at once on a kept connection: after a wait for a slot or for
// a new connection (up to connect_timeout), and on a retry (an earlier
// try of the call failed, after up to first_byte_timeout). A client
// gone then is errClientGoneUnsent, and nothing is sent. Sent, the
// upstream generated the answer, the client first looked at a second
// after the write, and a call whose client had left seconds before was
// billed in full.
func (p *connPool) roundTrip(req []byte, firstByte time.Duration, client net.Conn, retry bool) (*upstreamResponse, error) {
	for attempt := 1; ; attempt++ {
		uc, atOnce, err := p.acquire(client)
		if err != nil {
			return nil, err
		}
		if client != nil && (!atOnce || retry) && rawconn.PeerClosed(client) {
			p.release(uc) // unused: as good as it was
			return nil, errClientGoneUnsent
		}
		if uc.tc != nil {
			uc.tc.firstByte = cmp.Or(firstByte, uc.tc.firstByteConfigured)
			uc.tc.client, uc.tc.clientGone = client, false
			uc.tc.dueBy = time.Time{} // a whole answer's (awaitAnswerBy) holds until the next request
		}
		resp := upstreamResponsePool.Get().(*upstreamResponse)
		resp.pool, resp.uc = p, uc
		err = resp.exchange(req)
		if err == nil && uc.reused && resp.Header.StatusCode() == fasthttp.StatusRequestTimeout && attempt < 2 {
			// A 408 on a kept connection is the upstream closing it at its
			// idle deadline, sent as the request went out (or before, too
			// late for rawconn.Quiet to see): it did not take the request,
			// which a client may repeat (RFC 9110, 15.5.9). Chromium sends
			// it again on a new connection; Go's transport does when the
			// 408 came before the request. Taken for the call's answer, it
			// reached clients under load.
			p.discard(uc)
			resp.recycle()
			p.dropIdle() // went idle before this one, as below
			continue
		}
		if err == nil {
			return resp, nil
		}
		if uc.tc != nil && uc.tc.clientGone {
			p.discard(uc) // the upstream's work on it stops with it
			resp.recycle()
			return nil, errClientGone
		}
		// Not one byte of an answer came, at once, on a connection that
		// served before and was not looked at when taken: the upstream
		// closed it while it sat idle. One that took the request, worked
		// on it and then closed (a crash, a restart) was sent it again on
		// a new connection, and generated it twice. So was one that
		// closed at once on reading it (a query of death), on a
		// connection found open when taken: its close came within the
		// stale window too. A request whose write failed never reached
		// the upstream whole, whatever the connection.
		// An interim response came: the upstream took the request.
		stale := uc.reused && (resp.unsent ||
			!uc.checked && resp.interim == 0 && (uc.tc == nil || uc.tc.awaitingFirst && time.Since(uc.tc.wroteAt) < uc.staleWindow()) && !isTimeout(err))
		p.discard(uc)
		resp.recycle()
		if !stale || attempt >= 2 {
			return nil, err
		}
		// The others kept idle went idle before this one (it was the
		// most recent): the upstream's keep-alive closed them too, and
		// the one retry took the next of them and failed with a 503.
		p.dropIdle()
	}
}

func (r *upstreamResponse) exchange(req []byte) error {
	if _, err := r.uc.conn.Write(req); err != nil {
		r.unsent = true
		return err
	}
	for {
		if err := r.Header.Read(r.uc.br); err != nil {
			return headerReadError(err)
		}
		if st := r.Header.StatusCode(); st >= 200 || st == 101 {
			break
		}
		// 1xx: informational; the real answer follows. Its first byte,
		// not the interim response's, is the one first_byte_timeout (a
		// non-streamed call's response_timeout) waits for, watching the
		// client meanwhile: counted as the first byte, an upstream sending
		// 103 Early Hints every half second held a call past both, under
		// idle_timeout alone, and billed a client gone meanwhile in full;
		// 102 Processing would have held it for ever.
		if r.interim++; r.interim > maxInterimResponses {
			return errTooManyInterim
		}
		if tc := r.uc.tc; tc != nil && r.interim == 1 {
			tc.dueBy = tc.wroteAt.Add(tc.firstByte)
			tc.awaitingFirst = true
		}
	}
	if tc := r.uc.tc; tc != nil && r.interim > 0 {
		tc.dueBy, tc.awaitingFirst, tc.readWait = time.Time{}, false, 0 // as at a first byte
	}
	switch cl := r.Header.ContentLength(); {
	case r.Header.StatusCode() == 204 || r.Header.StatusCode() == 304:
		r.done = true
	case cl == -1:
		r.chunked = true
	case cl == -2:
		r.untilClose = true
	case cl == 0:
		r.done = true
	default:
		r.left = int64(cl)
	}
	return nil
}

// errBadHeader: a response header that is not HTTP/1.1 (a Content-Length
// twice, a bad status line, a header over the 16 KiB read buffer).
var errBadHeader = errors.New("sent an invalid response header")

// headerReadError words an error fasthttp met reading a response header.
// Its message quotes what it read ("…: buffer size=343, contents:
// "HTTP/1.1 200 OK…"), and a bad status line or header value within it
// too: the answer, body included, went to the log and the admin API's
// last_error, for keys with logging off as well; and a header it could not
// parse reached the client as "is unreachable: the connection failed".
// A failed read (the upstream closed, reset, timed out) keeps its cause,
// without the bytes; a header it could not parse is errBadHeader, with
// fasthttp's reason up to its first quote.
func headerReadError(err error) error {
	if err == io.EOF || err == fasthttp.ErrTimeout {
		return err // nothing read: nothing quoted
	}
	msg := err.Error()
	if i := strings.Index(msg, ": buffer size="); i >= 0 {
		msg = msg[:i]
	}
	var netErr net.Error
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr) {
		return &cutHeaderError{msg: msg, err: err}
	}
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		msg = "over 16 KiB"
	case errors.Is(err, fasthttp.ErrDuplicateContentLength):
		msg = "Content-Length twice"
	default:
		msg = strings.TrimPrefix(msg, "error when reading response headers: ")
		msg = strings.TrimPrefix(msg, "fasthttp: ")
		if i := strings.IndexByte(msg, '"'); i >= 0 {
			msg = msg[:i]
		}
		msg = strings.TrimRight(msg, ": ")
	}
	return fmt.Errorf("%w (%s)", errBadHeader, msg)
}

// cutHeaderError is a response header's read that failed, in fasthttp's
// words up to where they quote what was read; it unwraps to the cause.
type cutHeaderError struct {
	msg string
	err error
}

func (e *cutHeaderError) Error() string { return e.msg }
func (e *cutHeaderError) Unwrap() error { return e.err }

// maxInterimResponses is how many interim (1xx) responses an answer may
// come after. Their wait is bounded by the first byte's deadline; this
// bounds their number within it.
const maxInterimResponses = 100

// errTooManyInterim: an upstream that sent interim responses in place of
// an answer.
var errTooManyInterim = errors.New("sent more than 100 interim (1xx) responses before its answer")

// errBodyTooLarge: an answer above max_response_body.
var errBodyTooLarge = errors.New("larger than max_response_body")

// errEmptyAnswer: a success status with an empty body.
var errEmptyAnswer = errors.New("answered with an empty body")

// errEncodedAnswer: the upstream compressed its answer although asked for
// identity; the gateway reads usage from it and relays it as it is, so it
// cannot pass it on.
var errEncodedAnswer = errors.New("answered with a Content-Encoding although asked for none (Accept-Encoding: identity)")

// errClosedBeforeBody: the upstream sent a response header and closed the
// connection before the body that header announced.
var errClosedBeforeBody = errors.New("closed the connection after the response header, before the body")

// awaitBody waits for the body's first byte, if it has not come with the
// header, under first_byte_timeout. Servers that stream (vLLM, SGLang)
// send their header at once and the first event only once the request
// left their queue; timed by idle_timeout, such an upstream would hold a
// call for a minute after the client already had a 200. Until the first
// byte nothing has gone to the client, so a failure here may be retried.
//
// whole: the answer of a non-streamed call, whose body is due whole by
// the deadline its header had (response_timeout), and is read watching
// the client as the header was. Timed by idle_timeout from its first
// byte, an answer whose upstream sent a few bytes (whitespace, which some
// send to keep a long generation's connection open) and the rest later
// was cut with a 502, unbilled, once the pause passed idle_timeout; and a
// client that left during the pause was billed the whole answer, which
// the upstream went on generating. The checks on the client cost nothing
// while the body comes: only a read that waits clientCheckEvery, or one
// a clientCheckEvery after the last look, looks.
func (r *upstreamResponse) awaitBody(whole bool) error {
	if r.done {
		// A 2xx with no body (204, Content-Length: 0) is no answer to a
		// generation call; passed on, the client got an empty 200, billed.
		// Its connection goes with it: kept, a body the upstream sent
		// after it, in a later packet, was the next call's answer.
		r.err = errEmptyAnswer
		return errEmptyAnswer
	}
	if tc := r.uc.tc; tc != nil && whole {
		tc.awaitAnswerBy()
	}
	if r.uc.br.Buffered() > 0 {
		return nil
	}
	if r.uc.tc != nil {
		r.uc.tc.awaitingFirst = true
	}
	if _, err := r.uc.br.Peek(1); err != nil {
		if err == io.EOF {
			err = errClosedBeforeBody
		}
		r.err = err
		return err
	}
	return nil
}

// Read reads the body. It returns what has already arrived as soon as
// there is some, and waits on the upstream only when nothing has: so one
// Read hands out every event of a stream that came in one TCP read.
func (r *upstreamResponse) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	n := 0
	for n < len(p) && !r.done {
		br := r.uc.br
		if n > 0 && br.Buffered() == 0 {
			break
		}
		if r.chunked && r.left == 0 {
			if n > 0 && !r.chunkHeaderBuffered() {
				break
			}
			if err := r.nextChunk(); err != nil {
				r.err = err
				break
			}
			continue
		}
		want := len(p) - n
		if !r.untilClose && int64(want) > r.left {
			want = int(r.left)
		}
		m, err := br.Read(p[n : n+want])
		n += m
		r.left -= int64(m)
		if err == io.EOF && r.untilClose {
			r.done = true
			break
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			r.err = err
			break
		}
		if !r.chunked && !r.untilClose && r.left == 0 {
			r.done = true
		}
		if r.chunked && r.left == 0 {
			r.needCRLF = true
		}
	}
	if n > 0 {
		return n, nil
	}
	if r.err != nil {
		return 0, r.err
	}
	return 0, io.EOF
}

// chunkHeaderBuffered reports whether the next chunk's size line is whole
// in the buffer, so parsing it cannot wait on the upstream.
func (r *upstreamResponse) chunkHeaderBuffered() bool {
	b, _ := r.uc.br.Peek(r.uc.br.Buffered())
	if r.needCRLF {
		if len(b) < 2 {
			return false
		}
		b = b[2:]
	}
	return bytes.IndexByte(b, '\n') >= 0
}

var errBadChunk = errors.New("malformed chunked encoding from upstream")

// nextChunk reads the CRLF ending the previous chunk and the next size
// line; at the last chunk it reads the trailer and marks the body done.
func (r *upstreamResponse) nextChunk() error {
	br := r.uc.br
	if r.needCRLF {
		if err := expectCRLF(br); err != nil {
			return err
		}
		r.needCRLF = false
	}
	line, err := readLine(br)
	if err != nil {
		return err
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i] // chunk extensions
	}
	size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
	if err != nil || size < 0 {
		return errBadChunk
	}
	if size > 0 {
		r.left = size
		return nil
	}
	for { // trailer fields, up to the blank line
		line, err := readLine(br)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			r.done = true
			return nil
		}
	}
}

func expectCRLF(br *bufio.Reader) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	if len(line) != 0 {
		return errBadChunk
	}
	return nil
}

// readLine returns one line without its CRLF or LF.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err == bufio.ErrBufferFull {
			err = errBadChunk
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// readAll reads the rest of the body into dst, refusing more than limit
// bytes.
func (r *upstreamResponse) readAll(dst []byte, limit int64) ([]byte, error) {
	if r.done {
		return dst, nil
	}
	return readAllFrom(r, dst, limit)
}

// Close gives the connection back when the body was read to its end and
// the upstream keeps it open; otherwise it closes it, which is what stops
// an upstream still generating for a client that went away.
//
// Bytes already read past the answer's end (a second response after a
// sized body, more after a chunked body's last chunk, a body after a
// 204) are nothing the gateway asked for: kept, the connection had them
// taken for the answer to its next request, and every call after it got
// the answer to the call before, billed on that call's usage.
// rawconn.Quiet, when the connection is taken again, sees only what is
// still in the socket. Empty lines alone are no answer: RFC 9112 (2.2)
// has a recipient ignore them before a start line, and servers that end
// a sized body with a stray CRLF had every connection closed, counted as
// an overrun and dialled again, call after call.
func (r *upstreamResponse) Close() {
	if r.uc == nil {
		return
	}
	overrun := r.uc.br.Buffered()
	if overrun > 0 && r.done {
		if b, _ := r.uc.br.Peek(overrun); onlyLineEnds(b) {
			_, _ = r.uc.br.Discard(overrun)
			overrun = 0
		}
	}
	keep := r.done && r.err == nil && !r.untilClose && !r.Header.ConnectionClose() && overrun == 0
	if keep && r.pool.https {
		var open bool
		overrun, open = r.uc.strayHeldByTLS()
		keep = open && overrun == 0
	}
	if keep {
		r.pool.release(r.uc)
	} else {
		if r.done && overrun > 0 && r.pool.overran != nil {
			r.pool.overran(overrun)
		}
		r.pool.discard(r.uc)
	}
	r.recycle()
}

// strayHeldByTLS reads what the TLS connection of an https upstream
// holds already after an answer read to its end, without a system call
// (timeoutConn.heldOnly), and answers how many bytes other than empty
// lines it held, and whether the connection is still open (no
// close_notify, no broken record). crypto/tls takes all the socket has
// when it needs a record: a second response the upstream sent right
// after the answer, as records of their own in one TCP segment, sat in
// its buffer, seen neither by Close's look at the bufio.Reader nor by
// rawconn.Quiet's at the socket, and was the next call's answer, billed
// on its usage. Post-handshake messages (TLS 1.3's NewSessionTicket and
// KeyUpdate) are crypto/tls's own and read as nothing; so does a record
// held in part, whose rest, in the socket or still to come, is a later
// packet's, as over http (rawconn.Quiet).
func (uc *upstreamConn) strayHeldByTLS() (stray int, open bool) {
	tlsConn, ok := uc.conn.(*tls.Conn)
	if !ok || uc.tc == nil {
		return 0, true
	}
	var buf [512]byte
	uc.tc.heldOnly = true
	defer func() { uc.tc.heldOnly = false }()
	for {
		n, err := tlsConn.Read(buf[:])
		if n > 0 && !onlyLineEnds(buf[:n]) {
			stray += n
		}
		if err == errNothingHeld {
			return stray, true
		}
		if err != nil {
			return stray, false
		}
	}
}

// onlyLineEnds reports whether b is nothing but CRs and LFs: empty
// lines, or the start of one, that a server sent after an answer.
func onlyLineEnds(b []byte) bool {
	for _, c := range b {
		if c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

func (r *upstreamResponse) recycle() {
	r.Header.Reset()
	r.pool, r.uc = nil, nil
	r.chunked, r.untilClose, r.needCRLF, r.done = false, false, false, false
	r.left, r.err, r.interim, r.unsent = 0, nil, 0, false
	upstreamResponsePool.Put(r)
}
