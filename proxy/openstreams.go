package proxy

import (
	"net"
	"sync"
	"sync/atomic"
)

// openStreams holds the streamed answers being relayed, so that a
// shutdown that cannot wait for them any longer can end them the way an
// upstream cut does: each client gets the stream_interrupted event and the
// call is billed on estimated usage before the process exits. Without it,
// the streams still open when the shutdown wait ran out were dropped with
// the process, unbilled, although their clients had received part of an
// answer.
type openStreams struct {
	mu    sync.Mutex
	calls map[*generationCall]net.Conn // the client's connection
	// cutting is set once CutStreams ran: streams that break from then on
	// were ended by the gateway, not by their upstream.
	cutting atomic.Bool
	// revocations counts the EndStreamsOfKey calls; a call notes it before
	// its admission (generationCall.revocationsSeen), and one added after
	// it changed asks whether its own key was revoked in between.
	revocations atomic.Uint64
}

// addStream holds a stream whose relay begins, and ends it at once if the
// gateway ended streams meanwhile: CutStreams ran, or its key was revoked
// while it waited for its upstream's first event. EndStreamsOfKey did not
// see such a call, and it ran to its end, billed in full. It reports
// whether the key is revoked: nothing has gone out to the client yet, and
// the caller answers the key's 401 in place of the stream.
func (s *Server) addStream(c *generationCall, client net.Conn) (keyRevoked bool) {
	o := &s.streams
	o.mu.Lock()
	if o.calls == nil {
		o.calls = map[*generationCall]net.Conn{}
	}
	o.calls[c] = client
	cut := o.cutting.Load()
	// Read under the lock EndStreamsOfKey counts under: either it finds
	// the call in calls, or the count has moved.
	revokedSince := o.revocations.Load() != c.revocationsSeen
	o.mu.Unlock()
	if !cut && revokedSince && c.key != nil && s.keyIsRevoked(c.key.ID) {
		c.keyRevoked.Store(true)
		cut = true
	}
	if cut {
		c.cutUpstream()
	}
	// Set here, or by an EndStreamsOfKey that found the call since.
	return c.keyRevoked.Load()
}

// keyIsRevoked says whether the snapshot, which is updated before
// EndStreamsOfKey is called, has the key revoked or deleted.
func (s *Server) keyIsRevoked(keyID string) bool {
	info, ok := s.accounts.KeyInfo(keyID)
	return !ok || info.RevokedAt != nil
}

// remove is called before the call releases its upstream connection, so
// that CutStreams, under the same lock, never closes a connection already
// back in the pool.
func (o *openStreams) remove(c *generationCall) {
	o.mu.Lock()
	delete(o.calls, c)
	o.mu.Unlock()
}

// CutStreams ends every streamed answer still being relayed by closing its
// upstream connection; each relay then sends its client the
// stream_interrupted event, records the call on estimated usage and
// returns. It answers how many it ended. Meant for a shutdown whose wait
// for open streams has run out: from then on, streams that start are cut
// too.
func (s *Server) CutStreams() int {
	o := &s.streams
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cutting.Store(true)
	for c := range o.calls {
		c.cutUpstream()
	}
	return len(o.calls)
}

// EndStreamsOfKey ends the streamed answers a key opened, as CutStreams
// ends them at shutdown, once the key is revoked: it is refused at
// admission from then on, but the streams it had opened went on to their
// end, billed to the account, for as long as the upstream generated. It
// answers how many it ended; a stream still waiting for its first event
// is not counted, and is ended when it comes (addStream).
func (s *Server) EndStreamsOfKey(keyID string) int {
	o := &s.streams
	o.mu.Lock()
	defer o.mu.Unlock()
	o.revocations.Add(1)
	n := 0
	for c := range o.calls {
		if c.key != nil && c.key.ID == keyID {
			c.keyRevoked.Store(true)
			c.cutUpstream()
			n++
		}
	}
	return n
}

// CallsWithUpstreams is how many calls are with an upstream now, streams
// included: at shutdown, those that are not open streams are non-streamed
// calls, or streams still waiting for their first event, whose clients
// get no answer when the process exits.
func (s *Server) CallsWithUpstreams() int64 {
	var n int64
	for _, up := range s.world.Load().upstreams {
		n += up.health.inflight.Load()
	}
	return n
}

// DropStreamClients closes the client connections of the streams
// CutStreams ended that are still open: a client that stopped reading
// keeps its relay blocked writing for up to its upstream's idle_timeout
// (expectClientProgress), longer than a shutdown waits, and a relay that
// has not returned has not recorded its call. The failed write
// ends the relay, which records the call. It answers how many it closed.
func (s *Server) DropStreamClients() int {
	o := &s.streams
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, client := range o.calls {
		if client != nil {
			_ = client.Close()
		}
	}
	return len(o.calls)
}

// cutUpstream closes the connection the call's answer is read from; the
// relay's next read fails at once.
func (c *generationCall) cutUpstream() {
	if c.resp != nil && c.resp.uc != nil {
		_ = c.resp.uc.conn.Close()
	}
}
