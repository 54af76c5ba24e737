package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/internal/jsoncheck"
)

// The routes of a stored response, answered by the upstream that created
// it (see responses.go for how the gateway remembers which one):
//
//	GET    /v1/responses/{id}               (query passed on, e.g. ?stream=true)
//	DELETE /v1/responses/{id}
//	POST   /v1/responses/{id}/cancel
//	GET    /v1/responses/{id}/input_items   (query passed on: limit, order, after…)
//
// They take a key with the generate scope and count against its rpm, and
// are not billed. An id the gateway does not know, or one created by
// another account, is the same 404 as OpenAI's; a known one is relayed to
// its upstream as it answers, its own 404 included.

var responsesPrefix = []byte("/v1/responses/")

// lateMappingWait is how long an unknown response id, or an unknown item
// sent by id alone, waits before it is looked up once more (see
// lookupLate).
const lateMappingWait = 100 * time.Millisecond

// lookupLate is lookup for an id a client names, looked up once more
// after lateMappingWait when KV is in use and it was not found: a whole
// answer's mapping reaches KV as its call ends, a few milliseconds after
// the client has it, and a client that goes on at once through another
// gateway (a GET, a DELETE, a previous_response_id) can ask before it
// lands. A known id does not wait.
func (r *ResponseStore) lookupLate(id string) (m responseMapping, found bool, err error) {
	m, found, err = r.lookup(context.Background(), id)
	if err == nil && !found && r.kv != nil {
		time.Sleep(lateMappingWait)
		m, found, err = r.lookup(context.Background(), id)
	}
	return m, found, err
}

// errResponseNotFound is OpenAI's (and vLLM's) 404 for an unknown response.
func errResponseNotFound(id string) *APIError {
	return &APIError{Status: 404, Type: "invalid_request_error", Message: "Response with id '" + id + "' not found."}
}

// errPreviousNotFound refuses a previous_response_id the gateway cannot
// place, or one of another account, in OpenAI's words and with its status
// (400), as if it did not exist.
func errPreviousNotFound(id string) *APIError {
	return &APIError{Status: 400, Type: "invalid_request_error", Code: "previous_response_not_found", Param: "previous_response_id",
		Message: "Previous response with id '" + id + "' not found."}
}

func errStateUnavailable(err error) *APIError {
	return &APIError{Status: 503, Type: "service_unavailable_error", Code: "state_unavailable",
		Message: "which upstream holds this response cannot be looked up now (" + err.Error() + "); try again"}
}

// previousResponse finds where the state a call continues lives: the
// name of the upstream holding it, and the tokens billed for it.
//
// An id the gateway cannot place is refused, not passed on: every
// account reaches the upstream with the same api_key, so the upstream's
// own check cannot tell accounts apart, and an id whose mapping expired
// or was never shared could be continued by anyone who learnt it. One the
// mappings cannot be looked up for (NATS down) is a 503 to retry.
func (s *Server) previousResponse(key *accounts.Key, id string) (string, int64, *APIError) {
	m, found, err := s.responses.lookupLate(id)
	switch {
	case err != nil:
		s.responses.logSometimes("responses: previous_response_id %s: %v", id, err)
		return "", 0, errStateUnavailable(err)
	case !found, m.Account != key.Account:
		return "", 0, errPreviousNotFound(id)
	}
	return m.Upstream, m.Tokens, nil
}

// maxItemReferences bounds the items one call may name by id: each is a
// lookup, in KV when this gateway did not make it.
const maxItemReferences = 256

// itemLookupBudget bounds the KV lookups of one call's items together.
const itemLookupBudget = 2 * kvLookupTimeout

// itemRef is one stored item input names by id. selfContained is a
// reasoning item that carries its own text (content or summary), as vLLM
// returns them and the SDKs send them back: vLLM reads that text and
// never looks the id up, and the id may be one the gateway never saw
// (the item of a "store": false response).
type itemRef struct {
	id            string
	selfContained bool
}

// itemReferences lists the stored items input names (each id once),
// which the upstream looks up by id: {"type":"item_reference","id":…};
// an item of an id alone, whose type OpenAI makes optional ({"id":…},
// "type" null); and a reasoning item by id without its encrypted_content,
// which OpenAI resolves from its store (LangChain and the OpenAI SDK's
// "append response.output" send those), self-contained when it carries
// its text. A message (a typeless item with a role, as the Vercel AI SDK
// sends earlier turns with store false, id included) names nothing, nor
// does a reasoning item with its encrypted_content.
// A duplicated key in an item is refused: the upstream keeps the last,
// gjson finds the first, and a reference could hide behind a message.
func itemReferences(input gjson.Result) ([]itemRef, *APIError) {
	if !input.IsArray() {
		return nil, nil
	}
	var refs []itemRef
	var keys jsoncheck.Keys
	var apiErr *APIError
	i := -1
	input.ForEach(func(_, item gjson.Result) bool {
		i++
		if !item.IsObject() {
			return true
		}
		var typ, id gjson.Result
		role, encrypted, text := false, false, false
		keys = jsoncheck.Keys{}
		item.ForEach(func(k, v gjson.Result) bool {
			// Any key written twice: the upstream reads the last, gjson
			// the first, and a check on one could be passed with the other
			// ("encrypted_content":"x","encrypted_content":null).
			if keys.Seen(k) {
				apiErr = BadRequest("input", "duplicate key "+strconv.Quote(k.Str)+" in input["+strconv.Itoa(i)+"]")
				return false
			}
			switch k.Str {
			case "type":
				typ = v
			case "id":
				id = v
			case "role":
				role = v.Type != gjson.Null
			case "encrypted_content":
				encrypted = v.Type == gjson.String && v.Str != ""
			case "content", "summary":
				text = text || holdsText(v)
			}
			return true
		})
		if apiErr != nil {
			return false
		}
		reasoning := typ.Type == gjson.String && typ.Str == "reasoning" && id.Exists() && !encrypted
		named := typ.Type == gjson.String && typ.Str == "item_reference" ||
			typ.Type == gjson.Null && id.Exists() && !role || reasoning
		if !named {
			return true
		}
		if id.Type != gjson.String {
			apiErr = wrongType("input["+strconv.Itoa(i)+"].id", "a string", id)
			return false
		}
		selfContained := reasoning && text
		if at := slices.IndexFunc(refs, func(r itemRef) bool { return r.id == id.Str }); at >= 0 {
			refs[at].selfContained = refs[at].selfContained && selfContained
			return true
		}
		if len(refs) == maxItemReferences {
			apiErr = BadRequest("input", "input names more than "+strconv.Itoa(maxItemReferences)+
				" different stored items by id (item_reference, or reasoning items without encrypted_content); the gateway looks up at most that many a call: send the earlier turns' content, or continue with previous_response_id")
			return false
		}
		refs = append(refs, itemRef{id: strings.Clone(id.Str), selfContained: selfContained})
		return true
	})
	return refs, apiErr
}

// holdsText reports a content or summary array with a part of non-empty
// text ({"type":"reasoning_text","text":"…"}, {"type":"summary_text",…}).
func holdsText(parts gjson.Result) bool {
	if !parts.IsArray() {
		return false
	}
	found := false
	parts.ForEach(func(_, part gjson.Result) bool {
		t := part.Get("text")
		found = t.Type == gjson.String && t.Str != ""
		return !found
	})
	return found
}

// errItemNotFound refuses an item sent by id alone that the gateway cannot
// place, or one of another account, with the same words: as if it did not
// exist.
func errItemNotFound(id string) *APIError {
	return BadRequest("input", "Item with id '"+id+"' not found. An item sent by its id alone (an item_reference, an item of an id only, "+
		"or a reasoning item with neither encrypted_content nor text in its content or summary) must be an output item of a response "+
		"this account stored through this gateway (not expired); send the item's content instead.")
}

// errItemOfAnother refuses a self-contained reasoning item whose id is
// another account's: the upstream may resolve the id from its store
// rather than read the text sent.
func errItemOfAnother(id string) *APIError {
	return BadRequest("input", "the reasoning item with id '"+id+"' carries an id this account's responses did not give it; "+
		"send the item without its id")
}

// referencedItems finds the upstream holding the stored items a call
// names in its input ("" when none is known). An item sent by id alone
// must be known and the caller's, as a previous_response_id must: the
// upstream resolves it from its own store with the api_key every account
// shares, so it returned another account's text to whoever sent the id.
// Those must all live on one upstream, the call's only one. A
// self-contained item (see itemRef) need not be known, but one known as
// another account's is refused all the same; one of the caller's picks
// the upstream when no item sent by id alone does (the last such item's
// holder), and never makes the call fail for being elsewhere.
//
// It reports whether that upstream is required (an item sent by id alone
// lives there) or only preferred.
func (s *Server) referencedItems(key *accounts.Key, refs []itemRef) (holder string, required bool, apiErr *APIError) {
	ctx, cancel := context.WithTimeout(context.Background(), itemLookupBudget)
	defer cancel()
	held := make([]responseMapping, len(refs))
	look := func() (missing bool, apiErr *APIError) {
		for i, ref := range refs {
			if held[i].Upstream != "" {
				continue
			}
			m, found, err := s.responses.lookupItem(ctx, ref.id)
			switch {
			case err != nil:
				s.responses.logSometimes("responses: item_reference %s: %v", ref.id, err)
				return false, errStateUnavailable(err)
			case found:
				held[i] = m
			case !ref.selfContained:
				missing = true
			}
		}
		return missing, nil
	}
	// Only an item that must be found waits for a late mapping: a
	// self-contained one is mostly of a "store": false response, which
	// is never mapped, and every turn would wait for nothing.
	missing, apiErr := look()
	if apiErr == nil && missing && s.responses.kv != nil {
		time.Sleep(lateMappingWait) // a mapping still being written (see lookupLate)
		_, apiErr = look()
	}
	if apiErr != nil {
		return "", false, apiErr
	}
	first, preferred := "", ""
	for i, m := range held {
		switch {
		case m.Upstream != "" && m.Account != key.Account && refs[i].selfContained:
			return "", false, errItemOfAnother(refs[i].id)
		case refs[i].selfContained:
			if m.Upstream != "" {
				preferred = m.Upstream
			}
		case m.Upstream == "" || m.Account != key.Account:
			return "", false, errItemNotFound(refs[i].id)
		case holder == "":
			holder, first = m.Upstream, refs[i].id
		case m.Upstream != holder:
			return "", false, BadRequest("input", "the items '"+first+"' and '"+refs[i].id+"' that input names by id are stored on different upstreams, "+
				"and a call reaches one: send the content of one of them instead of its item_reference")
		}
	}
	if holder == "" {
		return preferred, false, nil
	}
	return holder, true, nil
}

// pinnedIn is the upstream named holder if it is in p, where the call must
// go; nil (balance it as usual) when the holder left the model's pool.
func pinnedIn(w *World, p *pool, holder string) *upstream {
	up := w.upstreams[holder]
	for _, member := range p.members {
		if member.up == up {
			return up
		}
	}
	return nil
}

// responseState serves the routes under /v1/responses/; rest is the path
// after that prefix.
func (s *Server) responseState(ctx *fasthttp.RequestCtx, rest []byte) {
	w := s.world.Load()
	idb, action, key, apiErr := s.admitResponseState(ctx, rest)
	if apiErr != nil {
		WriteError(ctx, apiErr)
		return
	}
	method := string(ctx.Method())
	// The key's and the account's rates hold here too, but not
	// max_concurrent: these calls are not billed, and a cancel must
	// not wait for the stream it cancels. Counted before the lookup, so
	// a caller over its rpm is refused before the store is asked.
	acct, _ := s.accountLimits(key.Account)
	limit := s.limits.generationAdmission(key, acct, nil, false)
	if limit.n > 0 {
		if apiErr := limit.admit(ctx, 0); apiErr != nil {
			WriteError(ctx, apiErr)
			return
		}
		defer limit.done()
	}
	id := string(idb)
	// Looked up twice when unknown, as a previous_response_id is: a
	// DELETE answered 404 left the response stored upstream.
	m, found, err := s.responses.lookupLate(id)
	var refusal *APIError
	switch {
	case err != nil:
		refusal = errStateUnavailable(err)
	case !found || m.Account != key.Account:
		refusal = errResponseNotFound(id)
	case w.upstreams[m.Upstream] == nil:
		refusal = Unavailable(fmt.Sprintf("upstream %s, which holds response %s, is not configured any more", m.Upstream, id))
	}
	if refusal != nil {
		// No upstream was asked: the gateway's own refusal costs no
		// quota, as a generation call's does not (an unknown id used a
		// request of the key's rpm, and the SDKs retry a 503 twice).
		limit.refused(ctx)
		WriteError(ctx, refusal)
		return
	}
	suffix := ""
	if len(action) > 0 {
		suffix = "/" + string(action)
	}
	if s.relayState(ctx, w.upstreams[m.Upstream], &limit, method, id, suffix) && method == "DELETE" {
		s.responses.forget(id)
	}
}

// admitResponseState checks a call on /v1/responses/{id}[/action] by its
// path, its method (a 405 has its Allow header set) and its key, all in
// its headers: refusalFromHeaders asks it before the body is read.
func (s *Server) admitResponseState(ctx *fasthttp.RequestCtx, rest []byte) (idb, action []byte, key *accounts.Key, apiErr *APIError) {
	idb, action, _ = bytes.Cut(rest, []byte("/"))
	if n := len(action); n > 0 && action[n-1] == '/' {
		// As {id}/ is the response: input_items/ was no route.
		action = action[:n-1]
	}
	method := string(ctx.Method())
	var allow string
	switch string(action) {
	case "":
		allow = "DELETE, GET"
	case "cancel":
		allow = "POST"
	case "input_items":
		allow = "GET"
	}
	// POST on an id is no route, not a wrong method: the SDKs' POST
	// /v1/responses/input_tokens and /compact are endpoints this gateway
	// does not serve, and "use DELETE, GET" sent their users astray.
	if allow == "" || len(idb) == 0 || (action == nil && method == fasthttp.MethodPost) {
		return nil, nil, nil, NotFound("no route for " + method + " " + string(ctx.Path()) + " (served: POST /v1/responses, GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items)")
	}
	if !slices.Contains(strings.Split(allow, ", "), method) {
		return nil, nil, nil, notAllowed(ctx, allow)
	}
	key, apiErr = s.authorize(ctx, accounts.ScopeGenerate)
	return idb, action, key, apiErr
}

// relayState sends the call to up and relays its answer: status, body,
// content type; a stream as it comes. It reports a 2xx answer. A call
// that cannot have reached up (the connection refused, no free one)
// gives back what limit took.
//
// It goes through the upstream's connection pool, as generation calls do,
// under the same rules for a kept connection: looked at before reuse,
// replaced once when the upstream had closed it while idle, a 408 on it
// sent again on a new one. That a cancel may be sent twice is what a
// generation may: only when it cannot have reached the upstream.
func (s *Server) relayState(ctx *fasthttp.RequestCtx, up *upstream, limit *admission, method, id, suffix string) bool {
	req := bytebufferpool.Get()
	defer bytebufferpool.Put(req)
	var err error
	req.B, err = up.stateRequest(req.B[:0], method, "/responses/"+url.PathEscape(id)+suffix,
		string(ctx.URI().QueryString()), ctx.Request.Header.Peek("Accept"))
	if err != nil {
		limit.refused(ctx)
		WriteError(ctx, BadRequest("", err.Error()))
		return false
	}
	// The upstream's first_byte_timeout and idle_timeout bound the call.
	resp, err := up.pool.roundTrip(req.B, 0, nil, false)
	if err != nil {
		if !sentUpstream(err) {
			limit.refused(ctx)
		}
		WriteError(ctx, upstreamUnreachable(up, ", which holds response "+id+",", err))
		return false
	}
	status := resp.Header.StatusCode()
	if status >= 300 && status <= 399 {
		// Followed by no client (it had no Location), as for a
		// generation call (attempt); the response's holder is the only
		// upstream to ask.
		what := up.redirectAnswer(&resp.Header)
		resp.Close()
		up.answeredRedirect(string(ctx.Response.Header.Peek("x-request-id")), status, what)
		WriteError(ctx, &APIError{Status: 502, Type: "upstream_error", Code: "upstream_bad_answer",
			Message: fmt.Sprintf("upstream %s, which holds response %s, answered %d with %s; it was not passed on", up.cfg.Name, id, status, what)})
		return false
	}
	copyUpstreamHeaders(ctx, &resp.Header)
	if bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) && !resp.done {
		ctx.SetStatusCode(status)
		setStreamHeaders(ctx)
		sendStream(ctx, &stateStream{resp: resp})
		return status >= 200 && status <= 299
	}
	body := bytebufferpool.Get()
	defer bytebufferpool.Put(body)
	body.B, err = resp.readAll(body.B[:0], int64(up.cfg.MaxResponseBody))
	resp.Close()
	if err != nil {
		WriteError(ctx, upstreamCut(up, err))
		return false
	}
	if status == fasthttp.StatusUnauthorized || status == fasthttp.StatusForbidden {
		// The gateway's api_key refused, as on a generation call
		// (attempt): passed on, the SDKs raised AuthenticationError.
		msg := "no JSON error"
		if looksLikeJSONObject(body.B) {
			msg = up.errorMessage(refusalError(body.B))
		}
		up.refusedCredentials(string(ctx.Response.Header.Peek("x-request-id")), status, msg)
		WriteError(ctx, &APIError{Status: 502, Type: "upstream_error", Code: "upstream_credentials_refused",
			Message: fmt.Sprintf("upstream %s, which holds response %s, refused the gateway's credentials for it (answered %d: %s); the gateway's operator must fix its api_key", up.cfg.Name, id, status, msg)})
		return false
	}
	ctx.SetStatusCode(status)
	if status >= 200 && status <= 299 {
		ctx.SetBody(body.B) // a copy
		return true
	}
	ctx.SetBody(up.masked(body.B))
	return false
}

// stateRequest appends a whole state call to up for path (under
// base_url) and the client's query to dst. accept is the client's Accept
// header, passed on (an SDK's ?stream=true asks text/event-stream).
func (up *upstream) stateRequest(dst []byte, method, path, query string, accept []byte) ([]byte, error) {
	// Parsed, not pasted: a control byte in the client's query must not
	// end up as a header line of the upstream's request.
	u, err := url.Parse(up.cfg.EndpointURL(path, query))
	if err != nil {
		return dst, fmt.Errorf("the query string cannot be passed on: %w", errors.Unwrap(err))
	}
	dst = appendHead(dst, method, u.RequestURI(), u.Host, up.authHeader)
	if len(accept) > 0 {
		dst = append(dst, "Accept: "...)
		dst = append(dst, accept...)
		dst = append(dst, "\r\n"...)
	}
	if method == fasthttp.MethodPost {
		// A POST without a length is refused by some servers (411).
		dst = append(dst, "Content-Length: 0\r\n"...)
	}
	return append(dst, "\r\n"...), nil
}

// stateStream relays an upstream's event stream (GET ?stream=true) to the
// client; each read is written as it comes (sendStream) and Close is
// called however the relay ended. The connection goes back to the pool only
// after the stream's clean end; otherwise it is closed, not drained.
type stateStream struct {
	resp *upstreamResponse
}

func (s *stateStream) Read(p []byte) (int, error) {
	if s.resp == nil {
		return 0, io.EOF
	}
	return s.resp.Read(p)
}

func (s *stateStream) Close() error {
	if s.resp != nil {
		s.resp.Close()
		s.resp = nil // back in its sync.Pool: another call's now
	}
	return nil
}
