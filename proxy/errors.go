package proxy

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// APIError is the one error type at the edge: every refusal the gateway
// itself produces is written as the OpenAI envelope
// {"error":{"message","type","param","code"}} so client libraries raise the
// matching exception (BadRequestError, AuthenticationError, …).
type APIError struct {
	Status  int
	Type    string
	Code    string // empty renders as null
	Param   string // empty renders as null
	Message string
	// RetryAfter, when set, is sent as Retry-After (whole seconds, at
	// least 1), which the SDKs wait for before they retry.
	RetryAfter time.Duration
	// NoRetry sends x-should-retry: false, which the OpenAI SDKs obey
	// over their own rule of retrying every 5xx: for an answer that
	// asking again would only pay for again.
	NoRetry bool
	// upstreams: the error an upstream answered, passed on in the
	// envelope (an error that blames the request, in a 200), not a call
	// the gateway refused: counted in tollgate_requests_total only, as
	// an upstream's own 4xx is.
	upstreams bool
}

func (e *APIError) Error() string { return e.Message }

type envelope struct {
	Error envelopeBody `json:"error"`
}

type envelopeBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// MarshalJSON renders the envelope.
func (e *APIError) MarshalJSON() ([]byte, error) {
	b := envelopeBody{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		p := e.Param
		b.Param = &p
	}
	if e.Code != "" {
		c := e.Code
		b.Code = &c
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // messages quote things like <API key> literally
	if err := enc.Encode(envelope{Error: b}); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// WriteError writes err as the response. Other packages (plugins, admin)
// use it so every error body looks the same.
func WriteError(ctx *fasthttp.RequestCtx, err *APIError) {
	// A client that left (499) was refused nothing: its call is counted
	// in tollgate_requests_total, as its usage event, and was in both.
	if err.Status >= 400 && err.Status < 500 && err.Status != statusClientClosed && !err.upstreams {
		refusals.count(ctx.Path(), err.Status)
	}
	setError(&ctx.Response, err)
	if err.Status == statusClientClosed {
		// The client is gone for the requests it pipelined behind this
		// one too: kept open, the connection served the next one from
		// fasthttp's buffer, sent it upstream and billed it another 499.
		ctx.SetConnectionClose()
	}
}

// setError makes resp err's answer: its status, its envelope, and the
// headers that say whether and when to retry.
func setError(resp *fasthttp.Response, err *APIError) {
	body, _ := err.MarshalJSON()
	resp.ResetBody()
	resp.SetStatusCode(err.Status)
	resp.Header.SetContentType("application/json")
	resp.SetBody(body)
	setRetryHeaders(&resp.Header, err)
}

// setRetryHeaders writes whether and when to ask err's request again:
// Retry-After (and retry-after-ms) for its RetryAfter, x-should-retry:
// false for NoRetry, and for every error whose wait the OpenAI SDKs would
// not honour (over sdkRetryWaitMax): they retry such a 429 or 503 after
// their own short backoff instead, twice, into the same answer, or sleep
// the whole wait inside the call. Decided here, where every error the
// gateway writes passes: a key's or an account's rate (refuse), an hourly
// cap on what an account makes (CreatedTooFast), a pool whose every
// upstream rests or is ejected (allDown), a classifier engine's upstream
// at its limit (plugins).
func setRetryHeaders(h *fasthttp.ResponseHeader, err *APIError) {
	if err.RetryAfter > 0 {
		SetRetryAfter(h, err.RetryAfter)
	}
	if err.NoRetry || err.RetryAfter > sdkRetryWaitMax {
		h.Set("x-should-retry", "false")
	}
}

// SetRetryAfter tells the client to wait d (WriteError's errors, and the
// console's pages): Retry-After in whole seconds, rounded up (at least
// 1), and retry-after-ms exactly, which the OpenAI
// SDKs and the Vercel AI SDK read first. A wait of 59.4 s was only
// "Retry-After: 60", which the AI SDK does not honour (under 60 s only):
// it retried after 2 s into a certain 429, and with one retry left the
// call failed.
func SetRetryAfter(h *fasthttp.ResponseHeader, d time.Duration) {
	h.Set("Retry-After", strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10))
	h.Set("retry-after-ms", strconv.FormatInt(max(int64((d+time.Millisecond-1)/time.Millisecond), 1), 10))
}

// Constructors for the statuses of spec section 7. The codes are the spec's
// where it names one and OpenAI's otherwise.

// BadRequest is 400 invalid_request_error; param names the offending field.
func BadRequest(param, msg string) *APIError {
	return &APIError{Status: 400, Type: "invalid_request_error", Code: "invalid_request_error", Param: param, Message: msg}
}

func errInvalidKey(msg string) *APIError {
	return &APIError{Status: 401, Type: "authentication_error", Code: "INVALID_API_KEY", Message: msg}
}

func errInsufficientBalance(msg string) *APIError {
	return &APIError{Status: 402, Type: "billing_error", Code: "INSUFFICIENT_BALANCE", Message: msg}
}

// Forbidden is 403: the key is valid but lacks a scope or model.
func Forbidden(msg string) *APIError {
	return &APIError{Status: 403, Type: "permission_error", Code: "permission_denied", Message: msg}
}

// NotFound is 404.
func NotFound(msg string) *APIError {
	return &APIError{Status: 404, Type: "not_found_error", Code: "not_found", Message: msg}
}

// errModelNotFound is OpenAI's own 404 for GET /v1/models/{id}, so SDK code
// that checks for code model_not_found works unchanged.
func errModelNotFound(id string) *APIError {
	return &APIError{Status: 404, Type: "invalid_request_error", Code: "model_not_found", Param: "model", Message: "The model '" + id + "' does not exist"}
}

// Conflict is 409.
func Conflict(msg string) *APIError {
	return &APIError{Status: 409, Type: "conflict_error", Code: "conflict", Message: msg}
}

// LimitReached is 409 for an account at one of its count caps (code, such
// as "too_many_keys"): the request itself is fine, and the same request
// succeeds once the account holds fewer of the thing. Waiting does not
// lower the count, so it is no 429, and the OpenAI SDKs, which retry a
// 409, are told not to.
func LimitReached(code, msg string) *APIError {
	return &APIError{Status: 409, Type: "conflict_error", Code: code, Message: msg, NoRetry: true}
}

// sdkRetryWaitMax is the longest Retry-After the OpenAI SDKs wait for;
// past it they retry after their own short backoff instead.
const sdkRetryWaitMax = time.Minute

// CreatedTooFast is 429 for an account at one of its limits on what it
// may make in an hour (keys, batch jobs): the request is fine, and the
// same request succeeds after wait (over a minute, the SDKs' retries a
// second or two later would be refused the same: setRetryHeaders).
func CreatedTooFast(msg string, wait time.Duration) *APIError {
	e := errRateLimited(msg)
	e.RetryAfter = wait
	return e
}

// MethodNotAllowed answers 405 with the Allow header set to allow, for
// handlers outside this package that route by method themselves (admin).
func MethodNotAllowed(ctx *fasthttp.RequestCtx, allow string) { methodNotAllowed(ctx, allow) }

func errMethodNotAllowed(msg string) *APIError {
	return &APIError{Status: 405, Type: "invalid_request_error", Code: "method_not_allowed", Message: msg}
}

func errTooLarge(msg string) *APIError {
	return &APIError{Status: 413, Type: "invalid_request_error", Code: "request_too_large", Message: msg}
}

// Unavailable is 503: the generation gateway is not configured or unreachable.
func Unavailable(msg string) *APIError {
	return &APIError{Status: 503, Type: "service_unavailable_error", Code: "upstream_unavailable", Message: msg}
}

// NotAvailableHere is 503 for a part of the gateway that this gateway does
// not have (code, such as "engine_unavailable"): nothing upstream is down,
// and trying again will not help until the operator sets it up.
func NotAvailableHere(code, msg string) *APIError {
	return &APIError{Status: 503, Type: "service_unavailable_error", Code: code, Message: msg}
}

// Internal is 500 for faults of the gateway itself.
func Internal(msg string) *APIError {
	return &APIError{Status: 500, Type: "server_error", Code: "internal_error", Message: msg}
}
