package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/money"
)

// AdminAPI serves /admin/v1: accounts, credit and keys. It is what the CLI
// and the console call; every call needs the admin bearer token.
type AdminAPI struct {
	token  []byte
	svc    *accounts.Service
	logins ConsoleLogins // nil until the console is configured
}

// ConsoleLogins issues one-time sign-in tokens for the web console. The
// console package implements it; the admin API only hands the link out.
type ConsoleLogins interface {
	IssueLogin(ctx context.Context, account string) (token string, expiresAt time.Time, err error)
}

// SetConsoleLogins enables POST /admin/v1/accounts/{id}/console-login.
// Call it before Serve: it is not synchronized with running requests.
func (a *AdminAPI) SetConsoleLogins(l ConsoleLogins) { a.logins = l }

// NewAdminAPI serves the admin API with the given bearer token.
func NewAdminAPI(token string, svc *accounts.Service) *AdminAPI {
	return &AdminAPI{token: []byte(token), svc: svc}
}

const adminTimeout = 10 * time.Second

func (a *AdminAPI) handle(ctx *fasthttp.RequestCtx, w *World) {
	h := ctx.Request.Header.Peek("Authorization")
	tok, ok := bytes.CutPrefix(h, []byte("Bearer "))
	if !ok || subtle.ConstantTimeCompare(bytes.TrimSpace(tok), a.token) != 1 {
		WriteError(ctx, &APIError{Status: 401, Type: "authentication_error", Code: "invalid_admin_token",
			Message: "admin API needs Authorization: Bearer <admin token> (TOLLGATE_ADMIN_TOKEN or <data_dir>/admin.token)"})
		return
	}
	rest, ok := strings.CutPrefix(string(ctx.Path()), "/admin/v1/")
	if !ok {
		WriteError(ctx, NotFound("no admin route "+string(ctx.Path())))
		return
	}
	parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	c, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	method := string(ctx.Method())
	switch {
	case len(parts) == 1 && parts[0] == "accounts":
		a.route(ctx, method, "POST", func() { a.createAccount(c, ctx) })
	case len(parts) == 2 && parts[0] == "accounts":
		a.route(ctx, method, "GET", func() { a.getAccount(c, ctx, parts[1]) })
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "credit":
		a.route(ctx, method, "POST", func() { a.credit(c, ctx, parts[1]) })
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "keys":
		switch method {
		case "POST":
			a.createKey(c, ctx, w, parts[1])
		case "GET":
			a.listKeys(c, ctx, parts[1])
		default:
			methodNotAllowed(ctx, "GET, POST")
		}
	case len(parts) == 2 && parts[0] == "keys":
		a.route(ctx, method, "DELETE", func() { a.revokeKey(c, ctx, parts[1]) })
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "console-login":
		a.route(ctx, method, "POST", func() { a.consoleLogin(c, ctx, parts[1]) })
	case len(parts) == 1 && parts[0] == "upstreams":
		a.route(ctx, method, "GET", func() { writeJSON(ctx, 200, map[string]any{"data": upstreamStatuses(w)}) })
	default:
		WriteError(ctx, NotFound("no admin route "+string(ctx.Path())))
	}
}

func (a *AdminAPI) route(ctx *fasthttp.RequestCtx, method, want string, fn func()) {
	if method != want {
		methodNotAllowed(ctx, want)
		return
	}
	fn()
}

// decodeStrict decodes a JSON body refusing unknown fields, so a typo in an
// admin call fails loudly instead of being ignored.
func decodeStrict(ctx *fasthttp.RequestCtx, v any) bool {
	body := ctx.PostBody()
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		WriteError(ctx, BadRequest("", "invalid JSON body: "+err.Error()))
		return false
	}
	return true
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		WriteError(ctx, Internal(err.Error()))
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// writeStoreError maps account-store errors to the envelope.
func writeStoreError(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, accounts.ErrNotFound):
		WriteError(ctx, NotFound(err.Error()))
	case errors.Is(err, accounts.ErrExists):
		WriteError(ctx, Conflict(err.Error()))
	case errors.Is(err, context.DeadlineExceeded):
		WriteError(ctx, Unavailable("account store did not answer in time: "+err.Error()))
	default:
		WriteError(ctx, BadRequest("", err.Error()))
	}
}

type accountView struct {
	ID          string    `json:"id"`
	BalanceUSD  string    `json:"balance_usd"`
	CreditedUSD string    `json:"credited_usd"`
	DebitedUSD  string    `json:"debited_usd"`
	CreatedAt   time.Time `json:"created_at"`
}

func viewAccount(acc accounts.Account) accountView {
	return accountView{ID: acc.ID, BalanceUSD: acc.Balance.String(), CreditedUSD: acc.Credited.String(),
		DebitedUSD: acc.Debited.String(), CreatedAt: acc.CreatedAt}
}

func parseUSDField(ctx *fasthttp.RequestCtx, field, s string, positive bool) (money.Nanos, bool) {
	n, err := money.ParseUSD(s)
	if err == nil && (n < 0 || positive && n == 0) {
		err = errors.New("must be greater than zero")
		if !positive {
			err = errors.New("must not be negative")
		}
	}
	if err != nil {
		WriteError(ctx, BadRequest(field, fmt.Sprintf("%s: %v (write USD as a decimal string such as \"10.00\")", field, err)))
		return 0, false
	}
	return n, true
}

func (a *AdminAPI) createAccount(c context.Context, ctx *fasthttp.RequestCtx) {
	var req struct {
		ID        string `json:"id"`
		CreditUSD string `json:"credit_usd"`
	}
	if !decodeStrict(ctx, &req) {
		return
	}
	if req.ID == "" {
		WriteError(ctx, BadRequest("id", "id is required"))
		return
	}
	credit := money.Nanos(0)
	if req.CreditUSD != "" {
		var ok bool
		if credit, ok = parseUSDField(ctx, "credit_usd", req.CreditUSD, false); !ok {
			return
		}
	}
	acc, err := a.svc.CreateAccount(c, req.ID, credit)
	if err != nil {
		writeStoreError(ctx, err)
		return
	}
	writeJSON(ctx, 201, viewAccount(acc))
}

func (a *AdminAPI) getAccount(c context.Context, ctx *fasthttp.RequestCtx, id string) {
	acc, err := a.svc.Account(c, id)
	if err != nil {
		writeStoreError(ctx, err)
		return
	}
	writeJSON(ctx, 200, viewAccount(acc))
}

func (a *AdminAPI) credit(c context.Context, ctx *fasthttp.RequestCtx, id string) {
	var req struct {
		USD string `json:"usd"`
	}
	if !decodeStrict(ctx, &req) {
		return
	}
	amount, ok := parseUSDField(ctx, "usd", req.USD, true)
	if !ok {
		return
	}
	acc, err := a.svc.Credit(c, id, amount)
	if err != nil {
		writeStoreError(ctx, err)
		return
	}
	writeJSON(ctx, 200, viewAccount(acc))
}

type keyRequest struct {
	Name      string   `json:"name"`
	Scopes    []string `json:"scopes"`
	Models    []string `json:"models"`
	RPM       int64    `json:"rpm"`
	TPM       int64    `json:"tpm"`
	ExpiresIn string   `json:"expires_in"` // Go duration, e.g. "720h"
	Logging   *struct {
		Enabled       bool `json:"enabled"`
		RetentionDays int  `json:"retention_days"`
	} `json:"logging"`
}

func (a *AdminAPI) createKey(c context.Context, ctx *fasthttp.RequestCtx, w *World, account string) {
	var req keyRequest
	if !decodeStrict(ctx, &req) {
		return
	}
	if req.Name == "" {
		WriteError(ctx, BadRequest("name", "name is required: name keys after where they are used, e.g. \"prod-backend\""))
		return
	}
	for _, sc := range req.Scopes {
		if !contains(accounts.AllScopes, sc) {
			WriteError(ctx, BadRequest("scopes", fmt.Sprintf("unknown scope %q; scopes are %s", sc, strings.Join(accounts.AllScopes, ", "))))
			return
		}
	}
	for _, m := range req.Models {
		if _, ok := w.Catalog.Resolve(m); !ok {
			WriteError(ctx, BadRequest("models", fmt.Sprintf("unknown model %q; valid models: %s", m, w.Catalog.ValidList())))
			return
		}
	}
	if req.RPM < 0 || req.TPM < 0 {
		WriteError(ctx, BadRequest("rpm", "rpm and tpm must not be negative"))
		return
	}
	kr := accounts.KeyRequest{Name: req.Name, Scopes: req.Scopes, Models: req.Models, RPM: req.RPM, TPM: req.TPM}
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			WriteError(ctx, BadRequest("expires_in", "expires_in must be a positive duration such as \"720h\""))
			return
		}
		kr.ExpiresIn = d
	}
	if req.Logging != nil {
		if req.Logging.RetentionDays < 0 {
			WriteError(ctx, BadRequest("logging.retention_days", "retention_days must not be negative"))
			return
		}
		kr.Logging = accounts.Logging{Enabled: req.Logging.Enabled, RetentionDays: req.Logging.RetentionDays}
	}
	info, token, err := a.svc.CreateKey(c, account, kr)
	if err != nil {
		writeStoreError(ctx, err)
		return
	}
	writeJSON(ctx, 201, struct {
		accounts.KeyInfo
		Key string `json:"key"`
	}{info, token})
}

func (a *AdminAPI) listKeys(c context.Context, ctx *fasthttp.RequestCtx, account string) {
	if _, err := a.svc.Account(c, account); err != nil {
		writeStoreError(ctx, err)
		return
	}
	keys, err := a.svc.ListKeys(c, account)
	if err != nil {
		writeStoreError(ctx, err)
		return
	}
	if keys == nil {
		keys = []accounts.KeyInfo{}
	}
	writeJSON(ctx, 200, struct {
		Object string             `json:"object"`
		Data   []accounts.KeyInfo `json:"data"`
	}{"list", keys})
}

func (a *AdminAPI) revokeKey(c context.Context, ctx *fasthttp.RequestCtx, keyID string) {
	info, err := a.svc.RevokeKey(c, keyID)
	if err != nil {
		writeStoreError(ctx, err)
		return
	}
	writeJSON(ctx, 200, struct {
		accounts.KeyInfo
		Revoked bool `json:"revoked"`
	}{info, true})
}

// consoleLogin answers {"url","expires_at"}: a one-time link that signs the
// account holder into the web console. The link is the credential: hand it
// to the account holder only.
func (a *AdminAPI) consoleLogin(c context.Context, ctx *fasthttp.RequestCtx, account string) {
	if a.logins == nil {
		WriteError(ctx, &APIError{Status: 503, Type: "service_unavailable_error", Code: "console_unavailable",
			Message: "the web console is not configured on this gateway"})
		return
	}
	if _, err := a.svc.Account(c, account); err != nil {
		writeStoreError(ctx, err)
		return
	}
	token, expiresAt, err := a.logins.IssueLogin(c, account)
	if err != nil {
		WriteError(ctx, Internal("issuing a console login: "+err.Error()))
		return
	}
	scheme := "http"
	if ctx.IsTLS() {
		scheme = "https"
	}
	link := scheme + "://" + string(ctx.Host()) + "/console/login?token=" + url.QueryEscape(token)
	writeJSON(ctx, 201, struct {
		Account   string    `json:"account"`
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}{account, link, expiresAt})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
