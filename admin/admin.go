package admin

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/internal/jsoncheck"
	"github.com/tollgate/tollgate/internal/suggest"
	"github.com/tollgate/tollgate/proxy"
)

// API serves /admin/v1: accounts, credit, keys and upstream status, plus
// the admin routes of the server's modules. Every call needs the admin
// bearer token.
type API struct {
	token []byte
	svc   *accounts.Service
}

// New serves the admin API with the given bearer token.
func New(token string, svc *accounts.Service) *API {
	return &API{token: []byte(token), svc: svc}
}

// Call is one admin call being served; Ctx bounds its store operations
// (10 seconds).
type Call = proxy.AdminCall

// Handler answers a call: body is written as JSON with status. An error
// is written as the error envelope: a *proxy.APIError as it is, an
// account-store error as writeError maps it.
type Handler = func(call *Call) (status int, body any, err error)

// Route is one admin call. Path is relative to /admin/v1/, segments split
// by "/"; a segment "{}" matches any one segment. Modules add routes of
// their own with proxy.Provisioned.AdminRoutes.
type Route = proxy.AdminRoute

func (a *API) routes() []Route {
	return []Route{
		{Method: "POST", Path: "accounts", Handle: a.createAccount},
		{Method: "GET", Path: "accounts", Query: []string{"limit", "after"}, Handle: a.listAccounts},
		{Method: "GET", Path: "accounts/{}", Handle: a.getAccount},
		{Method: "PATCH", Path: "accounts/{}", Handle: a.updateAccount},
		{Method: "POST", Path: "accounts/{}/credit", Handle: a.credit},
		{Method: "POST", Path: "accounts/{}/keys", Handle: a.createKey},
		{Method: "GET", Path: "accounts/{}/keys", Handle: a.listKeys},
		{Method: "GET", Path: "keys/{}", Handle: a.getKey},
		{Method: "DELETE", Path: "keys/{}", Handle: a.revokeKey},
		{Method: "GET", Path: "upstreams", Handle: upstreams},
	}
}

const adminTimeout = 10 * time.Second

// ServeAdmin serves one call under /admin/; proxy.Server calls it with the
// admin routes of its modules.
func (a *API) ServeAdmin(ctx *fasthttp.RequestCtx, w *proxy.World, modules []Route) {
	h := ctx.Request.Header.Peek("Authorization")
	// The scheme is case-insensitive (RFC 9110), as /v1 reads it. Only
	// ASCII spaces are trimmed, and an empty token matches nothing.
	ok := len(h) > 7 && strings.EqualFold(string(h[:7]), "bearer ") && len(a.token) > 0
	if !ok || subtle.ConstantTimeCompare(bytes.Trim(h[7:], " \t"), a.token) != 1 {
		proxy.WriteError(ctx, &proxy.APIError{Status: 401, Type: "authentication_error", Code: "invalid_admin_token",
			Message: "admin API needs Authorization: Bearer <admin token> (TOLLGATE_ADMIN_TOKEN or <data_dir>/admin.token)"})
		return
	}
	// Routes match the path as sent, not ctx.Path(), which fasthttp has
	// decoded and cleaned: "accounts/acme/../acme4/credit" credited acme4,
	// and "accounts/acme%2Fkeys" listed acme's keys.
	path := string(ctx.Request.URI().PathOriginal())
	rest, ok := strings.CutPrefix(path, "/admin/v1/")
	if !ok {
		proxy.WriteError(ctx, proxy.NotFound("no admin route "+path))
		return
	}
	parts, err := pathSegments(rest)
	if err != nil {
		writeError(ctx, err)
		return
	}
	method := string(ctx.Method())
	if method == fasthttp.MethodHead {
		// HEAD is GET without the body, as on the API's routes (fasthttp
		// drops the body of an answer to HEAD): it was a 405.
		method = fasthttp.MethodGet
	}
	c, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	var allowed []string
	for _, r := range append(a.routes(), modules...) {
		args, ok := match(r.Path, parts)
		if !ok {
			continue
		}
		if r.Method != method {
			allowed = append(allowed, r.Method)
			if r.Method == fasthttp.MethodGet {
				allowed = append(allowed, fasthttp.MethodHead)
			}
			continue
		}
		if err := checkQuery(ctx.URI().QueryString(), ctx.QueryArgs(), r.Query); err != nil {
			writeError(ctx, err)
			return
		}
		status, body, err := r.Handle(&Call{Ctx: c, HTTP: ctx, World: w, Args: args})
		if err != nil {
			writeError(ctx, err)
			return
		}
		writeJSON(ctx, status, body)
		return
	}
	if len(allowed) > 0 {
		sort.Strings(allowed)
		proxy.MethodNotAllowed(ctx, strings.Join(allowed, ", "))
		return
	}
	proxy.WriteError(ctx, proxy.NotFound("no admin route "+path))
}

// checkQuery refuses a query parameter a route does not take (taken, its
// Route.Query), naming it, and one given twice. Only the accounts list
// looked at its query: every other route answered as if "?limt=5" or
// "?account=acme" had been read. raw is the query as sent: args, as
// fasthttp parses it, drops "=" and keeps "=x" as a parameter named "",
// so "?=" was taken and "?=x" refused as an unknown parameter "".
func checkQuery(raw []byte, args *fasthttp.Args, taken []string) error {
	for part := range bytes.SplitSeq(raw, []byte("&")) {
		if name, value, ok := bytes.Cut(part, []byte("=")); ok && len(name) == 0 {
			return proxy.BadRequest("", fmt.Sprintf("the query has a parameter with no name (%q): name it, or leave it out", "="+string(value)))
		}
	}
	var seen []string
	for key := range args.All() {
		name := string(key)
		if !slices.Contains(taken, name) {
			msg := fmt.Sprintf("unknown query parameter %q", name)
			if near := suggest.Nearest(name, taken); near != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", near)
			}
			if len(taken) == 0 {
				return proxy.BadRequest(name, msg+"; this route takes no query parameters")
			}
			return proxy.BadRequest(name, msg+"; this route takes "+joinAnd(taken))
		}
		if slices.Contains(seen, name) {
			return proxy.BadRequest(name, fmt.Sprintf("query parameter %s is given twice: give it once", name))
		}
		seen = append(seen, name)
	}
	return nil
}

// joinAnd lists names as "a", "a and b", "a, b and c".
func joinAnd(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// pathSegments splits the path after /admin/v1/, as sent, at its slashes
// and decodes each segment. A segment that decodes to '.', '..' or holds
// a '/' is refused: it is no id, and it would read as another path to
// whatever joins the id into one (a log, a proxy in front, a store key).
func pathSegments(rest string) ([]string, error) {
	parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	for i, raw := range parts {
		seg, err := url.PathUnescape(raw)
		if err != nil {
			return nil, proxy.BadRequest("", fmt.Sprintf("path segment %q is not percent-encoded correctly", raw))
		}
		if seg == "." || seg == ".." || strings.Contains(seg, "/") {
			return nil, proxy.BadRequest("", fmt.Sprintf("path segment %q is not an id: an id holds no '/', escaped or not, and is not '.' or '..'", seg))
		}
		parts[i] = seg
	}
	return parts, nil
}

// match returns the segments of parts that pattern's "{}" segments match.
func match(pattern string, parts []string) ([]string, bool) {
	want := strings.Split(pattern, "/")
	if len(want) != len(parts) {
		return nil, false
	}
	var args []string
	for i, seg := range want {
		switch seg {
		case "{}":
			args = append(args, parts[i])
		case parts[i]:
		default:
			return nil, false
		}
	}
	return args, true
}

// DecodeBody decodes the call's JSON body into v as every admin route
// does (decodeStrict): one object, each field once and spelt exactly, no
// unknown field; an empty body is {}. A module's route that takes no
// fields decodes into &struct{}{}, so a body it would ignore is refused.
func DecodeBody(call *Call, v any) error {
	return decodeStrict(call.HTTP, v)
}

// decodeStrict decodes a JSON body refusing unknown fields, so a typo in an
// admin call fails loudly instead of being ignored.
func decodeStrict(ctx *fasthttp.RequestCtx, v any) error {
	body := ctx.PostBody()
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	// encoding/json matches names in any case, keeps the last of two
	// members of one name and ignores what follows the value: {"usd":"1",
	// "Usd":"1000"} credited 1000, where a log or an approval step reading
	// the body saw 1. The body must name each field once, exactly.
	if !gjson.ValidBytes(body) {
		return proxy.BadRequest("", "invalid JSON body: not one well-formed JSON value")
	}
	// encoding/json reads invalid UTF-8 and an escaped lone surrogate
	// ("\ud800") as U+FFFD, so a key name the console refuses as invalid
	// UTF-8 was stored, as another name than the one sent.
	if !utf8.Valid(body) {
		return proxy.BadRequest("", "invalid JSON body: not valid UTF-8; send text as UTF-8")
	}
	if jsoncheck.LoneSurrogate(body) {
		return proxy.BadRequest("", `invalid JSON body: a string escapes a lone surrogate (such as "\ud800" without the "\udc00" to "\udfff" after it), which is no character`)
	}
	// An array or a string was answered in Go's words ("cannot unmarshal
	// array into Go value of type struct { ID string ..."), null taken as {}.
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return proxy.BadRequest("", "the body must be a JSON object, got "+jsoncheck.Kind(root))
	}
	if err := checkMembers(root, reflect.TypeOf(v), ""); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// A value of the wrong type names the field and the type wanted,
		// not Go's "into Go struct field keyBody.rpm of type int64".
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return proxy.BadRequest(te.Field, fmt.Sprintf("%s must be %s, got %s", te.Field, jsonKind(te.Type), te.Value))
		}
		return proxy.BadRequest("", "invalid JSON body: "+err.Error())
	}
	return nil
}

// checkMembers refuses an object of v that names a member twice, one
// that matches a field of t only when case is ignored, one that matches
// none, or one that is null where its field has no `null:"ok"` tag; it
// descends into the fields and elements t gives a type to. A struct's
// fields are its own: an embedded struct's would be refused as unknown,
// so request types list theirs.
//
// encoding/json leaves a field null fills as it was, so null read as the
// field left out: {"max_concurrent":null} on a PATCH answered 200 and
// changed nothing. A field whose null means something says so by its tag.
func checkMembers(v gjson.Result, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case v.IsArray() && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i, el := range v.Array() {
			if err := checkMembers(el, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case v.IsObject() && t.Kind() == reflect.Struct:
		if dup := jsoncheck.DuplicateMember(v); dup != "" {
			return proxy.BadRequest(joinPath(path, dup), fmt.Sprintf("%q is given twice: send each field once", joinPath(path, dup)))
		}
		var err error
		v.ForEach(func(key, val gjson.Result) bool {
			field, exact := fieldFor(t, key.Str)
			switch {
			case field == nil:
				err = unknownField(t, path, key.Str)
			case !exact:
				err = proxy.BadRequest(joinPath(path, key.Str), fmt.Sprintf("unknown field %q (did you mean %q? names are case-sensitive)",
					joinPath(path, key.Str), joinPath(path, jsonName(*field))))
			case val.Type == gjson.Null && field.Tag.Get("null") != "ok":
				err = proxy.BadRequest(joinPath(path, key.Str), fmt.Sprintf("%s must be %s, got null: null means nothing here (send a value, or leave the field out where it may be)",
					joinPath(path, key.Str), jsonKind(field.Type)))
			default:
				err = checkMembers(val, field.Type, joinPath(path, key.Str))
			}
			return err == nil
		})
		return err
	}
	return nil
}

// unknownField is the 400 for member name of an object of t at path,
// which fills no field: named in param, with the fields t has. Go's own
// error ("invalid JSON body: json: unknown field") had no param, and did
// not say what the route takes.
func unknownField(t reflect.Type, path, name string) error {
	var fields []string
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() && jsonName(f) != "-" {
			fields = append(fields, jsonName(f))
		}
	}
	msg := fmt.Sprintf("unknown field %q", joinPath(path, name))
	if near := suggest.Nearest(name, fields); near != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", joinPath(path, near))
	}
	switch {
	case len(fields) == 0:
		msg += "; this route takes no fields: send no body, or {}"
	case path == "":
		msg += "; fields of this route: " + strings.Join(fields, ", ")
	default:
		msg += "; fields of " + path + ": " + strings.Join(fields, ", ")
	}
	return proxy.BadRequest(joinPath(path, name), msg)
}

// fieldFor finds the field of struct t that JSON member name fills, and
// whether name spells its JSON name exactly.
func fieldFor(t reflect.Type, name string) (*reflect.StructField, bool) {
	var folded *reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		switch n := jsonName(f); {
		case n == name:
			return &f, true
		case folded == nil && strings.EqualFold(n, name):
			folded = &f
		}
	}
	return folded, false
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "" {
		return f.Name
	}
	return name
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// jsonKind words a Go type as the JSON a client should send.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a " + t.String()
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		proxy.WriteError(ctx, proxy.Internal(err.Error()))
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// writeError writes err as the envelope; account-store errors get the
// status that says what went wrong.
func writeError(ctx *fasthttp.RequestCtx, err error) {
	var apiErr *proxy.APIError
	switch {
	case errors.As(err, &apiErr):
		proxy.WriteError(ctx, apiErr)
	case errors.Is(err, accounts.ErrNotFound):
		proxy.WriteError(ctx, proxy.NotFound(err.Error()))
	case errors.Is(err, accounts.ErrExists):
		proxy.WriteError(ctx, proxy.Conflict(err.Error()))
	case errors.Is(err, accounts.ErrInvalidInput):
		proxy.WriteError(ctx, proxy.BadRequest("", refusal(err)))
	case errors.Is(err, context.DeadlineExceeded):
		proxy.WriteError(ctx, proxy.Unavailable("account store did not answer in time: "+err.Error()))
	default:
		// NATS failing (a cluster electing a new leader, an outage): the
		// request was fine and may be sent again. A 400 told an operator
		// revoking a key that the revocation was wrong, and it stayed valid.
		proxy.WriteError(ctx, proxy.Unavailable("account store unavailable (the change may not have been made; try again): "+err.Error()))
	}
}

// refusal is the message of an account store's ErrInvalidInput without
// the sentinel's "invalid input: ", which the 400 says already.
func refusal(err error) string {
	return strings.TrimPrefix(err.Error(), accounts.ErrInvalidInput.Error()+": ")
}

// fieldError is err, an account store's refusal of the body's field, as
// the 400 or 409 that names field in param; other errors are as they are.
func fieldError(field string, err error) error {
	switch {
	case errors.Is(err, accounts.ErrInvalidInput):
		return proxy.BadRequest(field, refusal(err))
	case errors.Is(err, accounts.ErrExists):
		conflict := proxy.Conflict(err.Error())
		conflict.Param = field
		return conflict
	}
	return err
}

func upstreams(call *Call) (int, any, error) {
	return 200, map[string]any{"data": call.World.UpstreamStatuses()}, nil
}
