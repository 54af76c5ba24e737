package console

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/proxy"
)

// Options configures the console.
type Options struct {
	Accounts *accounts.Service
	// JetStream holds the sign-in tokens (bucket TOLLGATE_CONSOLE_LOGINS),
	// the sessions signed out, the key forms sent, and the fingerprint of
	// the console secret every gateway on it must share.
	JetStream jetstream.JetStream
	Replicas  int
	// DataDir holds console.secret, the key of the session cookies; Open
	// fails if it is not the one the other gateways on JetStream hold.
	DataDir string
	// ClickHouseDSN is where usage is read, connected to on first use with
	// short timeouts. Empty, or unreachable: the console says "usage
	// unavailable" and everything else works.
	ClickHouseDSN string
	// ClickHouse, when set, is used instead of ClickHouseDSN; the caller
	// keeps ownership and closes it.
	ClickHouse driver.Conn
	// SessionTTL is how long a sign-in lasts; 0 means DefaultSessionTTL.
	SessionTTL time.Duration
	Logf       func(format string, args ...any)
}

// Console serves the /console pages of this process.
type Console struct {
	accounts *accounts.Service
	logins   *Logins
	sessions sessions
	signOuts *signOuts
	keyForms *keyForms
	usage    *usageReader
	logf     func(string, ...any)
	// public is server.public_url as of the last provisioning (each
	// config reload provisions again); nil when unset.
	public atomic.Pointer[url.URL]
	// hstsMaxAge is server.hsts_max_age in seconds as of the last
	// provisioning; 0 sends no Strict-Transport-Security.
	hstsMaxAge atomic.Int64
}

const storeTimeout = 10 * time.Second

// maxFormBody caps a console request's body: its forms are a few fields.
// The session is checked only after the body, so under the gateway's
// max_request_body a client with no session held 8 MiB per connection
// for the read timeout.
const maxFormBody = 64 << 10

// Open builds the console. Module makes a gateway serve it; Close it after
// that gateway's Close.
func Open(ctx context.Context, opts Options) (*Console, error) {
	if opts.Accounts == nil || opts.JetStream == nil || opts.DataDir == "" {
		return nil, errors.New("console: Accounts, JetStream and DataDir are required")
	}
	secret, err := loadOrCreateSecret(opts.DataDir)
	if err != nil {
		return nil, err
	}
	signer := sessions{secret: secret, ttl: opts.SessionTTL, now: time.Now}
	if err := signer.checkSharedSecret(ctx, opts.JetStream, opts.Replicas, opts.DataDir); err != nil {
		return nil, err
	}
	logins, err := OpenLogins(ctx, opts.JetStream, opts.Replicas)
	if err != nil {
		return nil, err
	}
	c := &Console{
		accounts: opts.Accounts,
		logins:   logins,
		sessions: signer,
		usage:    &usageReader{dsn: opts.ClickHouseDSN, conn: opts.ClickHouse, logf: opts.Logf},
		logf:     opts.Logf,
	}
	if c.sessions.ttl <= 0 {
		c.sessions.ttl = DefaultSessionTTL
	}
	if c.signOuts, err = openSignOuts(ctx, opts.JetStream, opts.Replicas, c.sessions.ttl); err != nil {
		return nil, err
	}
	if c.keyForms, err = openKeyForms(ctx, opts.JetStream, opts.Replicas, c.sessions.ttl); err != nil {
		c.signOuts.close()
		return nil, err
	}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	if c.usage.logf == nil {
		c.usage.logf = c.logf
	}
	return c, nil
}

// Close closes the ClickHouse connection the console opened.
func (c *Console) Close() {
	c.signOuts.close()
	c.usage.close()
}

// Module is the console as a module of a proxy.Server: the pages under
// /console and, behind the admin token, the admin API's console-login.
// Each provisioning serves the same console, so sign-in links and
// sessions outlive reloads.
func (c *Console) Module() proxy.Module {
	return proxy.Module{ID: "console", New: c.provision}
}

func (c *Console) provision(_ proxy.Host, w *proxy.World) (proxy.Provisioned, error) {
	var public *url.URL
	if raw := w.Config.Server.PublicURL; raw != "" {
		u, err := url.Parse(raw) // validated by config
		if err != nil {
			return proxy.Provisioned{}, err
		}
		public = u
	}
	c.public.Store(public)
	c.hstsMaxAge.Store(int64(w.Config.Server.HSTSMaxAge / time.Second))
	pages := []struct {
		method, path string
		handle       func(*fasthttp.RequestCtx, *proxy.Call)
	}{
		{"GET", "/console", c.overview},
		{"GET", "/console/login", c.signInPage},
		{"POST", "/console/login", c.signIn},
		{"POST", "/console/logout", c.signOut},
		{"GET", "/console/keys", c.keys},
		{"POST", "/console/keys", c.createKey},
		{"GET", "/console/keys/revoke", c.confirmRevoke},
		{"POST", "/console/keys/revoke", c.revoke},
		// Any other path under /console is a page too, whatever the
		// method: a mistyped or old bookmark got the API's JSON 404 or
		// 405. AnyMethod, not GET and POST routes over "/*": those
		// answered GET /console/logout and POST /console/style.css with
		// this 404 before the pages' own 405 (PUT there was a 405).
		{proxy.AnyMethod, "/console/*", c.noSuchPage},
		{"GET", "/console/style.css", c.style},
		{"GET", "/console/", c.toOverview},
	}
	var p proxy.Provisioned
	for _, r := range pages {
		// AuthNone: the console signs in with its own cookie, never with an
		// API key.
		p.Routes = append(p.Routes, proxy.Route{Method: r.method, Path: r.path, Auth: proxy.AuthNone, Handler: r.handle,
			MethodNotAllowed: c.methodNotAllowed, MaxBody: maxFormBody, Headers: c.protectiveHeaders})
	}
	// The operator's way in: behind the admin token, under /admin/v1.
	p.AdminRoutes = []admin.Route{
		{Method: "POST", Path: "accounts/{}/console-login", Handle: c.consoleLogin},
		{Method: "POST", Path: "accounts/{}/console-logout", Handle: c.consoleLogout},
	}
	return p, nil
}

// protectiveHeaders are the headers of every console answer. Each
// console route has the server set them (proxy.Route.Headers) before it
// answers or refuses the request, so a handler need not: its 413 of a
// body over maxFormBody, which no handler sees, had none.
func (c *Console) protectiveHeaders(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	// no-store: pages hold balances and, once, a key; none may linger
	// in a cache or in the back/forward history.
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin: sign-in links carry a token in their URL, which must
	// never travel in a Referer to another site.
	h.Set("Referrer-Policy", "same-origin")
	c.strictTransport(ctx)
}

// consoleLogin serves POST /admin/v1/accounts/{id}/console-login: a
// one-time link that signs the account holder into the console. The link
// is the credential: hand it to the account holder only.
func (c *Console) consoleLogin(call *admin.Call) (int, any, error) {
	// It takes no fields, and refuses a body rather than ignore it, as
	// the other admin routes do.
	if err := admin.DecodeBody(call, &struct{}{}); err != nil {
		return 0, nil, err
	}
	account := call.Args[0]
	if _, err := c.accounts.Account(call.Ctx, account); err != nil {
		return 0, nil, err
	}
	token, expiresAt, err := c.logins.IssueLogin(call.Ctx, account)
	if err != nil {
		// Its store failing (NATS electing a leader, away): a link
		// stored but never shown signs no one in, so sending the request
		// again is safe. A 500 read as a fault of the gateway.
		return 0, nil, proxy.Unavailable("issuing a console login (no link was given out; send it again): " + err.Error())
	}
	scheme, host := c.origin(call.HTTP)
	link := scheme + "://" + host + "/console/login?token=" + url.QueryEscape(token)
	return 201, struct {
		Account   string    `json:"account"`
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}{account, link, expiresAt}, nil
}

// methodNotAllowed answers a method a console page does not take (PUT,
// DELETE, GET of a form's target) with a page, as noSuchPage answers a
// path: it got the API's JSON.
func (c *Console) methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	// Allow is this page's methods: "The console's pages take POST only"
	// (GET /console/logout) was said of all of them.
	text := "This page takes " + allow + " only, not " + string(ctx.Method()) + "."
	if string(ctx.Path()) == "/console/logout" {
		// A bookmarked or typed sign-out link: signing out is a form, as
		// no GET may change anything.
		text += " To sign out, use the Sign out button at the top of any console page."
	} else {
		text += " The console starts at /console."
	}
	c.message(ctx, 405, "Not allowed", text, false)
}

func (c *Console) noSuchPage(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	c.messageWords(ctx, 404, "No such page", quoting("There is no console page at ", string(ctx.Path()), ". The console starts at /console."), false)
}

// consoleLogout serves POST /admin/v1/accounts/{id}/console-logout: the
// operator ends every console session of the account, on every gateway,
// and cancels its pending sign-in links (a link sent to the wrong person,
// a leaked cookie). Before it, only replacing console.secret did that,
// for every account at once.
func (c *Console) consoleLogout(call *admin.Call) (int, any, error) {
	// It takes no fields, and refuses a body rather than ignore it, as
	// the other admin routes do.
	if err := admin.DecodeBody(call, &struct{}{}); err != nil {
		return 0, nil, err
	}
	account := call.Args[0]
	if _, err := c.accounts.Account(call.Ctx, account); err != nil {
		return 0, nil, err
	}
	at, err := c.signOuts.signOutAccount(call.Ctx, account)
	if err != nil {
		return 0, nil, proxy.Unavailable("signing the account's console sessions out: " + err.Error())
	}
	cancelled, err := c.logins.Cancel(call.Ctx, account)
	if err != nil {
		return 0, nil, proxy.Unavailable("sessions are signed out, but cancelling the sign-in links failed: " + err.Error())
	}
	return 200, struct {
		Account        string    `json:"account"`
		SignedOutUntil time.Time `json:"sessions_ended_before"`
		LinksCancelled int       `json:"links_cancelled"`
	}{account, endedBefore(at), cancelled}, nil
}

// endedBefore is the whole second, UTC, before which every session of a
// sign-out made at at began, as the admin API answers times: sessions
// begin on whole seconds and one begun in at's second is ended too. The
// answer carried at's nanoseconds, unlike every other time of the API.
func endedBefore(at time.Time) time.Time {
	return at.UTC().Truncate(time.Second).Add(time.Second)
}

// strictTransport sends Strict-Transport-Security on a console answer
// served over https: with an https server.public_url (the proxy in front
// ends TLS), or on TLS to the gateway itself. Over plain http a browser
// ignores it, and the console's own scheme is all the gateway knows: an
// X-Forwarded-Proto is not believed. Not includeSubDomains: the gateway
// cannot know that the other hosts of its domain serve https.
func (c *Console) strictTransport(ctx *fasthttp.RequestCtx) {
	maxAge := c.hstsMaxAge.Load()
	if scheme, _ := c.origin(ctx); scheme != "https" || maxAge <= 0 {
		return
	}
	ctx.Response.Header.Set("Strict-Transport-Security", "max-age="+strconv.FormatInt(maxAge, 10))
}

// toOverview sends "/console/", which people type as often as "/console",
// to the overview.
func (c *Console) toOverview(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	ctx.Response.Header.Set("Location", "/console")
	ctx.SetStatusCode(fasthttp.StatusPermanentRedirect)
}

func (c *Console) style(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	// Cacheable, unlike the pages: protectiveHeaders set no-store.
	ctx.Response.Header.Set("Cache-Control", "public, max-age=3600")
	ctx.SetContentType("text/css; charset=utf-8")
	ctx.SetBody(styleCSS)
}

// session returns the signed-in session, or answers 401 and returns false.
func (c *Console) session(ctx *fasthttp.RequestCtx) (session, bool) {
	sess, err := c.sessions.verify(string(ctx.Request.Header.Cookie(cookieName)))
	switch {
	case err == nil && c.signOuts.signedOut(sess):
		c.clearCookie(ctx)
		c.message(ctx, 401, "Signed out", "This session was signed out; sign in again with a new link.", true)
	case err == nil:
		return sess, true
	case errors.Is(err, errSessionExpired):
		c.clearCookie(ctx)
		c.message(ctx, 401, "Session expired", "Your console session has ended; sign in again with a new link.", true)
	case errors.Is(err, errSessionInvalid):
		c.clearCookie(ctx)
		c.message(ctx, 401, "Not signed in", "Your session is not valid on this gateway: sign in again with a new link. (Its cookie was not signed here, or was signed before the console secret was replaced.)", true)
	default:
		c.message(ctx, 401, "Not signed in", "You are not signed in to the console.", true)
	}
	return session{}, false
}

// signedIn returns the session of the request's cookie if it is one
// this gateway takes, answering nothing and changing no cookie.
func (c *Console) signedIn(ctx *fasthttp.RequestCtx) (session, bool) {
	sess, err := c.sessions.verify(string(ctx.Request.Header.Cookie(cookieName)))
	return sess, err == nil && !c.signOuts.signedOut(sess)
}

// formSession is session for a form POST: it also refuses cross-site
// requests and a missing or wrong CSRF token (403).
func (c *Console) formSession(ctx *fasthttp.RequestCtx) (session, bool) {
	if !c.sameOrigin(ctx) {
		c.message(ctx, 403, "Refused", "This form was sent from another site.", false)
		return session{}, false
	}
	sess, ok := c.session(ctx)
	if !ok {
		return session{}, false
	}
	token := ctx.PostArgs().Peek("csrf")
	if len(token) == 0 {
		c.message(ctx, 403, "Form incomplete", "This form arrived without its security token, so it was not sent from a console page. Reload the page and try again.", false)
		return session{}, false
	}
	if !c.sessions.checkCSRF(sess, string(token)) {
		c.message(ctx, 403, "Form expired", "This form does not belong to your current console session. Reload the page and try again.", false)
		return session{}, false
	}
	return sess, true
}

// origin is the scheme and host the account holder's browser uses:
// server.public_url when set (behind a proxy that ends TLS the gateway
// sees plain HTTP and the proxy's upstream address), else the request's.
func (c *Console) origin(ctx *fasthttp.RequestCtx) (scheme, host string) {
	if u := c.public.Load(); u != nil {
		return u.Scheme, u.Host
	}
	scheme = "http"
	if ctx.IsTLS() {
		scheme = "https"
	}
	return scheme, string(ctx.Host())
}

// sameOrigin rejects POSTs a browser marks as coming from another site. The
// CSRF token is the real check; this also covers the sign-in form, which
// has no session yet. The origin may be the request's Host or
// server.public_url's.
func (c *Console) sameOrigin(ctx *fasthttp.RequestCtx) bool {
	switch string(ctx.Request.Header.Peek("Sec-Fetch-Site")) {
	case "", "same-origin", "none":
	default:
		return false
	}
	origin := ctx.Request.Header.Peek("Origin")
	if len(origin) == 0 {
		return true
	}
	u, err := url.Parse(string(origin))
	if err != nil {
		return false
	}
	if public := c.public.Load(); public != nil && strings.EqualFold(u.Scheme, public.Scheme) &&
		originHost(u.Scheme, u.Host) == originHost(public.Scheme, public.Host) {
		return true
	}
	return u.Host == string(ctx.Host())
}

// originHost is host as a browser writes it in Origin: lower case, without
// the scheme's default port (server.public_url may say
// https://GW.example.com:443).
func originHost(scheme, host string) string {
	host = strings.ToLower(host)
	switch {
	case strings.EqualFold(scheme, "https"):
		host = strings.TrimSuffix(host, ":443")
	case strings.EqualFold(scheme, "http"):
		host = strings.TrimSuffix(host, ":80")
	}
	return host
}

func (c *Console) setCookie(ctx *fasthttp.RequestCtx, value string, expires time.Time) {
	ck := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(ck)
	ck.SetKey(cookieName)
	ck.SetValue(value)
	ck.SetPath(cookiePath)
	ck.SetHTTPOnly(true)
	// Lax, not Strict: Strict left the cookie off a link followed from
	// another site (a mail, a chat, a wiki), and a signed-in holder got
	// "Not signed in". Lax sends it on such top-level GETs only, and no
	// GET changes anything; a form posted from another site gets no
	// cookie, and sameOrigin and the CSRF token refuse it besides.
	ck.SetSameSite(fasthttp.CookieSameSiteLaxMode)
	scheme, _ := c.origin(ctx)
	ck.SetSecure(scheme == "https")
	ck.SetExpire(expires)
	ctx.Response.Header.SetCookie(ck)
}

func (c *Console) clearCookie(ctx *fasthttp.RequestCtx) {
	c.setCookie(ctx, "", fasthttp.CookieExpireDelete)
}

func (c *Console) pageData(sess session, title, nav string, page any) pageData {
	return pageData{Title: title, Nav: nav, Account: sess.Account, CSRF: c.sessions.csrf(sess), Page: page}
}

// storeError answers an accounts-store failure.
func (c *Console) storeError(ctx *fasthttp.RequestCtx, what string, err error) {
	switch {
	case errors.Is(err, accounts.ErrNotFound):
		c.message(ctx, 404, "Not found", capitalize(what)+" does not exist.", false)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, broker.ErrLeaderUnavailable):
		c.logf("console: %s: %v", what, err)
		c.message(ctx, 503, "Try again", "The account store did not answer in time. Reload the page in a moment.", false)
	default:
		c.logf("console: %s: %v", what, err)
		c.message(ctx, 500, "Something went wrong", "The console could not read "+what+"; the gateway log says why.", false)
	}
}

// keyFormStoreError is storeError for a key form. When the store times
// out or NATS refuses a write (a stream electing its leader answers "no
// response from stream"), the key may have been made (a write can land
// after the wait): the page says what sending the form again does, which
// the generic "reload in a moment" left to guess, and a 500 "could not
// read" blamed the gateway.
func (c *Console) keyFormStoreError(ctx *fasthttp.RequestCtx, what string, err error) {
	if errors.Is(err, accounts.ErrNotFound) {
		c.storeError(ctx, what, err)
		return
	}
	c.logf("console: %s: %v", what, err)
	c.message(ctx, 503, "Try again", "The account store did not answer in time, so the key may or may not have been made. Reload this page in a moment to send the form again: if no key was made, that makes it; if one was, the page names it (its secret cannot be shown again). Sending the form again never makes a second key.", false)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func storeContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), storeTimeout)
}

func (c *Console) baseURL(ctx *fasthttp.RequestCtx) string {
	scheme, host := c.origin(ctx)
	return scheme + "://" + host + "/v1"
}

func seeOther(ctx *fasthttp.RequestCtx, location string) {
	ctx.Response.Header.Set("Location", location)
	ctx.SetStatusCode(fasthttp.StatusSeeOther)
}

// signInPage shows who a sign-in link is for and a button that redeems it.
// The GET itself uses nothing up and changes nothing, so a link previewer
// cannot burn the link; the button's same-site POST redeems it and sets
// the session cookie.
func (c *Console) signInPage(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	token := string(ctx.QueryArgs().Peek("token"))
	if token == "" {
		c.message(ctx, 200, "Sign in", "Sign in with the one-time link you were given.", true)
		return
	}
	sctx, cancel := storeContext()
	defer cancel()
	account, err := c.logins.Peek(sctx, token)
	if errors.Is(err, ErrLoginInvalid) {
		c.message(ctx, 401, "Sign-in link not valid", "This sign-in link is invalid, has expired or was already used.", true)
		return
	}
	if err != nil {
		c.storeError(ctx, "the sign-in link", err)
		return
	}
	c.render(ctx, 200, "login", pageData{Title: "Sign in", Page: loginPage{
		Account: account, Token: token, SessionHours: int(c.sessions.ttl / time.Hour)}})
}

func (c *Console) signIn(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	if !c.sameOrigin(ctx) {
		c.message(ctx, 403, "Refused", "This sign-in form was sent from another site.", true)
		return
	}
	sctx, cancel := storeContext()
	defer cancel()
	account, err := c.logins.Redeem(sctx, string(ctx.PostArgs().Peek("token")))
	if errors.Is(err, ErrLoginInvalid) {
		c.message(ctx, 401, "Sign-in link not valid", "This sign-in link is invalid, has expired or was already used.", true)
		return
	}
	if err != nil {
		c.storeError(ctx, "the sign-in link", err)
		return
	}
	value, sess, err := c.sessions.issue(account, c.signOuts.accountSignedOutAt(account))
	if err != nil {
		c.storeError(ctx, "a new session", err)
		return
	}
	c.setCookie(ctx, value, sess.Expires)
	seeOther(ctx, "/console")
}

func (c *Console) signOut(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	sess, ok := c.formSession(ctx)
	if !ok {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err := c.signOuts.signOut(sctx, sess); err != nil {
		// Ended on this gateway already; the others learn it only
		// through the bucket.
		c.logf("console: signing out a session of %s on every gateway: %v", sess.Account, err)
	}
	c.clearCookie(ctx)
	c.message(ctx, 200, "Signed out", "You are signed out of the console.", true)
}

func (c *Console) overview(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	sess, ok := c.session(ctx)
	if !ok {
		return
	}
	sctx, cancel := storeContext()
	defer cancel()
	acc, err := c.accounts.Account(sctx, sess.Account)
	if err != nil {
		c.storeError(ctx, "account "+sess.Account, err)
		return
	}
	view := overviewPage{Balance: usd(acc.Balance), Credited: usd(acc.Credited), Debited: usd(acc.Debited),
		Negative: acc.Balance < 0, Days: UsageDays, Months: UsageMonths,
		RPM: limitText(acc.Limits.RPM), TPM: limitText(acc.Limits.TPM), MaxConcurrent: limitText(acc.Limits.MaxConcurrent)}
	keyLimits := call.World.Config.Plugins.KeyLimits
	view.KeyRPM, view.KeyTPM, view.KeyConcurrent = limitText(keyLimits.RequestsPerMinute), limitText(keyLimits.TokensPerMinute), limitText(keyLimits.Concurrent)
	if grace := call.World.Grace(); acc.Balance < -grace {
		view.Refused, view.Grace = true, usd(grace)
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	rows, err := c.usage.usageSince(sctx, sess.Account, today.AddDate(0, 0, -(UsageDays-1)))
	if err != nil {
		view.UsageUnavailable = true
		// The operator's DSN is wrong: no outage the holder can wait out.
		view.UsageOff = billing.IsDSNSettings(err)
	} else {
		days, models, total := summarize(rows)
		for _, d := range days {
			view.PerDay = append(view.PerDay, lineOf(d))
		}
		for _, m := range models {
			view.PerModel = append(view.PerModel, lineOf(m))
		}
		view.Total = lineOf(total)
		thisMonth := time.Date(today.Year(), today.Month(), 1, 0, 0, 0, 0, time.UTC)
		months, err := c.usage.monthsSince(sctx, sess.Account, thisMonth.AddDate(0, -(UsageMonths-1), 0))
		if err != nil {
			view.UsageUnavailable = true
		}
		slices.SortFunc(months, func(a, b usageRow) int { return strings.Compare(b.Day, a.Day) })
		for _, m := range months {
			var t usageTotals
			t.add(m)
			t.Label = strings.TrimSuffix(m.Day, "-01")
			if m.Day == thisMonth.Format(time.DateOnly) {
				t.Label += " (so far)"
			}
			view.PerMonth = append(view.PerMonth, lineOf(t))
		}
	}
	c.render(ctx, 200, "overview", c.pageData(sess, "Overview", "overview", view))
}

// limitText is a limit as the overview shows it: an account's 0 and
// gateway.yaml's -1 (config.NoLimit) are none.
func limitText(n int64) string {
	if n <= 0 {
		return "no limit"
	}
	return thousands(n)
}

// keyInput is the create form as submitted, kept to show it again with an
// error.
type keyInput struct {
	Name      string
	Scopes    []string
	Models    []string
	Logging   bool
	Retention string
}

// deletedKeysShown is how many deleted keys the keys page lists, the latest
// deleted first. Deleted keys stay stored and their number has no cap (a
// holder can make and delete auth.max_keys_created_per_hour keys an
// hour), so listing all of them let a page grow without end: 19,000 made
// it 8.3 MB. The keys not deleted are bounded by
// auth.max_keys_per_account.
const deletedKeysShown = 20

func (c *Console) keys(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	sess, ok := c.session(ctx)
	if !ok {
		return
	}
	c.renderKeys(ctx, call, sess, 200, keyInput{Scopes: []string{accounts.ScopeGenerate}}, nil)
}

// renderKeys renders the list and the create form (with problem, if any).
func (c *Console) renderKeys(ctx *fasthttp.RequestCtx, call *proxy.Call, sess session, status int, in keyInput, problem words) {
	deleted := string(ctx.QueryArgs().Peek("deleted"))
	// The page a deletion redirects to, which a load balancer may have
	// sent to another gateway than the deletion: the list is this
	// gateway's copy of the keys, which the watch brings the revocation
	// to in milliseconds. Only a key of the account is waited for, so
	// that the wait tells nothing of other accounts' key ids. The flash
	// names the key even when it is past the deleted keys shown (deleted
	// on another tab).
	var flash words
	if info, ok := c.accounts.KeyInfo(deleted); deleted != "" && ok && info.Account == sess.Account && c.accounts.AwaitKeyRevoked(deleted, time.Second) {
		flash = quoting("Key “", info.Name, fmt.Sprintf("” (%s) is deleted: calls with it are refused.", info.KeyID))
	}
	// From memory: the page stays up while NATS replaces a lost leader.
	list, deletedNotShown, err := c.accounts.ListRecentKeys(sess.Account, deletedKeysShown)
	if err != nil {
		c.storeError(ctx, "the keys of "+sess.Account, err)
		return
	}
	view := keysPage{BaseURL: c.baseURL(ctx), Form: formFor(in, call.World.Catalog)}
	switch {
	case deletedNotShown == 1:
		view.DeletedNotShown = fmt.Sprintf("1 older deleted key is not shown: the list has your keys in use and the %d you deleted last.", deletedKeysShown)
	case deletedNotShown > 1:
		view.DeletedNotShown = fmt.Sprintf("%s older deleted keys are not shown: the list has your keys in use and the %d you deleted last.", thousands(int64(deletedNotShown)), deletedKeysShown)
	}
	// Each rendering of the form is a new form: sent again (a reload of
	// the page that answered it), it makes no other key.
	if view.Form.Token, err = newKeyFormToken(); err != nil {
		c.storeError(ctx, "a new key form", err)
		return
	}
	now := time.Now()
	for _, k := range list {
		view.Keys = append(view.Keys, describeKey(k, now))
	}
	data := c.pageData(sess, "API keys", "keys", view)
	data.Flash, data.Error = flash, problem
	c.render(ctx, status, "keys", data)
}

func formFor(in keyInput, cat *catalog.Catalog) keyForm {
	f := keyForm{Name: in.Name, Logging: in.Logging, Retention: in.Retention}
	if f.Retention == "" {
		f.Retention = "0"
	}
	for _, s := range accounts.AllScopes {
		f.Scopes = append(f.Scopes, scopeChoice{Name: s, Help: scopeHelp[s], Checked: slices.Contains(in.Scopes, s)})
	}
	for _, id := range cat.IDs() {
		f.Models = append(f.Models, modelChoice{ID: id, Selected: slices.Contains(in.Models, id)})
	}
	f.ModelRows = min(max(len(f.Models), 2), 8)
	return f
}

// keyRequest checks the form against the rules the admin API shares
// (admin.CheckKeyRequest) and the live catalog, and returns what to
// create, or a problem to show beside the form.
func keyRequest(in keyInput, cat *catalog.Catalog) (accounts.KeyRequest, string) {
	req := accounts.KeyRequest{Name: in.Name, Scopes: in.Scopes, Models: in.Models}
	// The days go to the check with the box as it is: days typed with
	// logging off are refused there, as the API and the CLI refuse them,
	// not dropped.
	days := 0
	if in.Retention != "" {
		var err error
		if days, err = strconv.Atoi(strings.TrimSpace(in.Retention)); err != nil {
			return req, fmt.Sprintf("Logging retention must be a whole number of days from 0 to %d (0 keeps logged calls with no expiry).", accounts.MaxRetentionDays)
		}
	}
	req.Logging = accounts.Logging{Enabled: in.Logging, RetentionDays: days}
	if p := admin.CheckKeyRequest(req, cat); p != nil {
		return req, capitalize(p.Message) + "."
	}
	// The admin API reads no scopes as all of them; a form sent with every
	// box unticked is more likely a slip.
	if len(in.Scopes) == 0 {
		return req, "Choose at least one scope."
	}
	return req, ""
}

func peekMulti(args *fasthttp.Args, name string) []string {
	var out []string
	for _, v := range args.PeekMulti(name) {
		out = append(out, string(v))
	}
	return out
}

func (c *Console) createKey(ctx *fasthttp.RequestCtx, call *proxy.Call) {
	sess, ok := c.formSession(ctx)
	if !ok {
		return
	}
	args := ctx.PostArgs()
	in := keyInput{
		// As typed: admin.CheckKeyRequest refuses spaces at the ends, as
		// the API does, rather than each path making its own name.
		Name:      string(args.Peek("name")),
		Scopes:    peekMulti(args, "scopes"),
		Models:    peekMulti(args, "models"),
		Logging:   string(args.Peek("logging")) == "on",
		Retention: string(args.Peek("retention_days")),
	}
	req, text := keyRequest(in, call.World.Catalog)
	problem := plain(text)
	if field, ok := unknownField(ctx, keyFormFields); ok {
		// Taken silently, a field the form does not have (rpm=5,
		// expires_in=1h) reads as a setting the key would not have.
		problem = quoting("This form has no field ", strconv.Quote(field), ".")
		if f := strings.ToLower(field); f == "rpm" || f == "tpm" || f == "max_concurrent" {
			problem = append(problem, plain(" Keys made here have no rate limits of their own: the limits of your account, on the Overview page, hold for all its keys together, and plugin calls have the per-key limits shown there.")...)
		}
	} else if field, n, ok := repeatedField(args, singleKeyFields); ok {
		// name=ok&name=second made a key "ok": the first was taken and the
		// others dropped, saying nothing.
		problem = plain(fmt.Sprintf("The field %q was sent %d times; this form sends it once.", field, n))
	} else if v := args.Peek("logging"); v != nil && string(v) != "on" {
		// A checkbox sends "on" or nothing: logging=yes or true made a key
		// with logging off, saying nothing.
		problem = quoting(`The field "logging" is "on" or left out; it was `, strconv.Quote(string(v)), ".")
	} else if token := args.Peek("form_token"); problem == nil && len(token) == 0 {
		// Without it a reload could not be told from a new form.
		problem = plain("This form arrived without the one-time token the API keys page gives it (form_token), so nothing was created. Check the form below and send it again.")
	} else if problem == nil && !wellFormedKeyFormToken(string(token)) {
		// It said "without the token" of a form that had one.
		problem = plain("This form's one-time token (form_token) arrived malformed: it is not the one the API keys page gives it, so nothing was created. Check the form below and send it again.")
	}
	if problem != nil {
		c.renderKeys(ctx, call, sess, 400, in, problem)
		return
	}
	sctx, cancel := storeContext()
	defer cancel()
	formToken := string(args.Peek("form_token"))
	first, err := c.keyForms.claim(sctx, formToken, sess.Account)
	if errors.Is(err, errKeyFormSent) {
		c.formSentBefore(sctx, ctx, sess, first)
		return
	}
	if err != nil {
		c.keyFormStoreError(ctx, "the key form", err)
		return
	}
	req.MaxKeys = call.World.Config.Auth.MaxKeysPerAccount
	req.MaxCreatedPerHour = call.World.Config.Auth.MaxKeysCreatedPerHour
	req.IdempotencyKey = formToken
	info, token, err := c.accounts.CreateKey(sctx, sess.Account, req)
	var madeBefore *accounts.KeyMadeError
	if errors.As(err, &madeBefore) {
		// A send before made the key and did not note it (the store failed
		// after its page showed the key): note it now, for the next send.
		if err := c.keyForms.made(sctx, formToken, sess.Account, madeBefore.KeyID); err != nil {
			c.logf("console: %v", err)
		}
		c.formSentBefore(sctx, ctx, sess, keyFormSent{Account: sess.Account, KeyID: madeBefore.KeyID})
		return
	}
	if err != nil {
		// No key made: the same form sent again is no reload.
		if rerr := c.keyForms.release(sctx, formToken, sess.Account); rerr != nil {
			c.logf("console: %v", rerr)
		}
	}
	if errors.Is(err, accounts.ErrInvalidInput) {
		c.renderKeys(ctx, call, sess, 400, in, plain(err.Error()))
		return
	}
	if errors.Is(err, accounts.ErrTooManyKeys) {
		c.renderKeys(ctx, call, sess, 409, in, plain(fmt.Sprintf("Your account has as many keys as this gateway allows (%d, auth.max_keys_per_account). Delete a key you no longer use, expired ones included, to make a new one.", req.MaxKeys)))
		return
	}
	var tooFast *accounts.KeyRateError
	if errors.As(err, &tooFast) {
		proxy.SetRetryAfter(&ctx.Response.Header, tooFast.Wait)
		c.renderKeys(ctx, call, sess, 429, in, plain(fmt.Sprintf("Your account has made %d keys in the last hour, at least as many as this gateway allows (auth.max_keys_created_per_hour, deleted keys included). You can make the next one in %s.",
			tooFast.Made, roundUpWait(tooFast.Wait))))
		return
	}
	if err != nil {
		c.keyFormStoreError(ctx, "a new key", err)
		return
	}
	if err := c.keyForms.made(sctx, formToken, sess.Account, info.KeyID); err != nil {
		// Sent again, the form takes its claim over and CreateKey names
		// this key (its id comes from the form's token): no second key.
		c.logf("console: %v", err)
	}
	// The one page that ever holds the token; it is sent no-store and is
	// not logged.
	data := c.pageData(sess, "Key created", "keys", createdPage{Name: info.Name, KeyID: info.KeyID, Token: token, BaseURL: c.baseURL(ctx)})
	data.Script = copyScript
	c.render(ctx, 200, "created", data)
}

// formSentBefore answers a key form sent again: a reload of the page that
// answered it, or a second click. The key's secret was shown once, on
// that page, and is not kept to show again.
func (c *Console) formSentBefore(ctx context.Context, rctx *fasthttp.RequestCtx, sess session, first keyFormSent) {
	var view resentPage
	// The first send may have been made through another gateway a moment
	// ago; unsynced, the page names no key rather than wait.
	synced := first.KeyID != "" && c.accounts.WaitSynced(ctx) == nil
	// Never a key of another account, however its form came here.
	if info, ok := c.accounts.KeyInfo(first.KeyID); synced && ok && first.Account == sess.Account && info.Account == sess.Account {
		view = resentPage{KeyID: info.KeyID, Name: info.Name, Active: info.RevokedAt == nil}
	}
	c.render(rctx, 409, "resent", c.pageData(sess, "Key already created", "keys", view))
}

// roundUpWait writes a wait for a person, rounded up: in seconds up to
// a minute, in minutes past it.
func roundUpWait(d time.Duration) string {
	unit, name := time.Second, "second"
	if d > time.Minute {
		unit, name = time.Minute, "minute"
	}
	if n := int64((d + unit - 1) / unit); n > 1 {
		return fmt.Sprintf("%d %ss", n, name)
	}
	return "a " + name
}

// keyFormFields are the fields of the key form (templates/keys.html).
var keyFormFields = map[string]bool{"csrf": true, "form_token": true, "name": true, "scopes": true, "models": true, "logging": true, "retention_days": true}

// singleKeyFields are the fields of the key form that hold one value
// (scopes and models are lists).
var singleKeyFields = []string{"csrf", "form_token", "name", "logging", "retention_days"}

// revokeFormFields are the fields of the form that deletes a key
// (templates/revoke.html); each holds one value (singleRevokeFields).
var (
	revokeFormFields   = map[string]bool{"csrf": true, "key_id": true}
	singleRevokeFields = []string{"csrf", "key_id"}
)

// unknownField returns the first field of a form post, in its body or its
// query string (the forms' actions have none), that fields does not name.
func unknownField(ctx *fasthttp.RequestCtx, fields map[string]bool) (string, bool) {
	for key := range ctx.QueryArgs().All() {
		return string(key), true
	}
	for key := range ctx.PostArgs().All() {
		if !fields[string(key)] {
			return string(key), true
		}
	}
	return "", false
}

// repeatedField returns the first of single, fields that hold one value,
// that a form post sends more than once, and how many times.
func repeatedField(args *fasthttp.Args, single []string) (string, int, bool) {
	for _, field := range single {
		if n := len(args.PeekMulti(field)); n > 1 {
			return field, n, true
		}
	}
	return "", 0, false
}

// ownedKey returns the key if it belongs to the session's account. A key of
// another account is answered exactly like a missing one (404), so ids of
// other accounts cannot be probed.
func (c *Console) ownedKey(ctx *fasthttp.RequestCtx, sess session, keyID string) (accounts.KeyInfo, bool) {
	if keyID == "" {
		// It said "Your account has no key ." (404).
		c.message(ctx, 400, "No key named", "No key was named: choose the key to delete on the API keys page, at /console/keys.", false)
		return accounts.KeyInfo{}, false
	}
	sctx, cancel := storeContext()
	defer cancel()
	// A key created through another gateway a moment ago must be found.
	if err := c.accounts.WaitSynced(sctx); err != nil {
		// Not keyID, which the address gave: it would reach the log.
		c.storeError(ctx, "the keys of "+sess.Account, err)
		return accounts.KeyInfo{}, false
	}
	info, ok := c.accounts.KeyInfo(keyID)
	if !ok || info.Account != sess.Account {
		c.messageWords(ctx, 404, "No such key", quoting("Your account has no key ", keyID, "."), false)
		return accounts.KeyInfo{}, false
	}
	return info, true
}

func (c *Console) confirmRevoke(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	sess, ok := c.session(ctx)
	if !ok {
		return
	}
	info, ok := c.ownedKey(ctx, sess, string(ctx.QueryArgs().Peek("key_id")))
	if !ok {
		return
	}
	if info.RevokedAt != nil {
		seeOther(ctx, "/console/keys?deleted="+url.QueryEscape(info.KeyID))
		return
	}
	c.render(ctx, 200, "revoke", c.pageData(sess, "Delete key", "keys", revokePage{ID: info.KeyID, Name: info.Name}))
}

func (c *Console) revoke(ctx *fasthttp.RequestCtx, _ *proxy.Call) {
	sess, ok := c.formSession(ctx)
	if !ok {
		return
	}
	// As the key form: key_id=A&key_id=B deleted A and said nothing of
	// B, and a field the form does not have was taken silently.
	if field, ok := unknownField(ctx, revokeFormFields); ok {
		c.messageWords(ctx, 400, "Form refused", quoting("This form has no field ", strconv.Quote(field), "; no key was deleted."), false)
		return
	}
	if field, n, ok := repeatedField(ctx.PostArgs(), singleRevokeFields); ok {
		c.message(ctx, 400, "Form refused", fmt.Sprintf("The field %q was sent %d times; this form sends it once. No key was deleted.", field, n), false)
		return
	}
	info, ok := c.ownedKey(ctx, sess, string(ctx.PostArgs().Peek("key_id")))
	if !ok {
		return
	}
	sctx, cancel := storeContext()
	defer cancel()
	if _, err := c.accounts.RevokeKey(sctx, info.KeyID); err != nil {
		c.storeError(ctx, "key "+info.KeyID, err)
		return
	}
	seeOther(ctx, "/console/keys?deleted="+url.QueryEscape(info.KeyID))
}
