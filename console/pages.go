package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/money"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/style.css
var styleCSS []byte

// pages are parsed once: each is the layout plus the page's "content".
var pages = func() map[string]*template.Template {
	out := map[string]*template.Template{}
	for _, name := range []string{"message", "login", "overview", "keys", "created", "resent", "revoke"} {
		out[name] = template.Must(template.New(name).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return out
}()

// copyScript is the console's only JavaScript: it reveals the Copy button
// on the key-created page and copies the key. Without it the key is still
// shown, selectable, in a read-only field.
const copyScript = `
for (const button of document.querySelectorAll("button[data-copy]")) {
  const field = document.getElementById(button.dataset.copy);
  const status = document.getElementById(button.dataset.status);
  button.hidden = false;
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(field.value);
      status.textContent = "Copied to the clipboard.";
    } catch (e) {
      field.select();
      status.textContent = "Copying failed: the key is selected, press Ctrl+C (or Cmd+C).";
    }
  });
}
`

// contentSecurityPolicy allows nothing from other origins and only the copy
// script by its hash, so even an injection bug could not load or run code.
var contentSecurityPolicy = func() string {
	sum := sha256.Sum256([]byte(copyScript))
	return "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'sha256-" +
		base64.StdEncoding.EncodeToString(sum[:]) + "'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}()

// pageData is what the layout reads; Page is the page's own view.
type pageData struct {
	Title   string
	Nav     string // "overview" or "keys": marks the current link
	Account string // empty when signed out: no navigation
	CSRF    string
	Flash   words
	Error   words
	Script  template.JS
	Page    any
}

type messagePage struct {
	Heading    string
	Text       words
	SignInHelp bool
	Back       backLink // none when Href is empty
}

// words is a sentence for a page with what a user wrote in it (a key's
// name, a path or key id from the address, a field sent) kept apart:
// the page shows each such part in <bdi>, so a right-to-left override or
// right-to-left letters in it cannot reorder the words around it and
// make "deleted" or a key id read as something else.
type words []wordsPart

type wordsPart struct {
	Text string
	User bool
}

// plain is text with nothing a user wrote in it.
func plain(text string) words {
	if text == "" {
		return nil
	}
	return words{{Text: text}}
}

// quoting is before, what a user wrote, then after.
func quoting(before, user, after string) words {
	return words{{Text: before}, {Text: validText(user), User: true}, {Text: after}}
}

// validText is s with each byte that is not part of UTF-8 made U+FFFD, as
// html/template makes a NUL: a path of the address (/console/%ff%fe) was
// echoed as its bytes into a page that says it is UTF-8.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string([]rune(s)) // each byte not UTF-8 is a utf8.RuneError
}

// backLink is a message page's way back into the console.
type backLink struct {
	Href, Text string
}

type loginPage struct {
	Account, Token string
	SessionHours   int
}

type overviewPage struct {
	Balance, Credited, Debited string
	Negative                   bool
	// Refused: the balance is past the grace allowance (Grace USD), and
	// calls are being refused now.
	Refused bool
	Grace   string
	// Limits are the account's own, set by the operator; "no limit" for 0.
	RPM, TPM, MaxConcurrent string
	// KeyRPM, KeyTPM and KeyConcurrent are gateway.yaml's
	// plugins.key_limits: what each key may make of plugin calls where it
	// has no rpm or tpm of its own.
	KeyRPM, KeyTPM, KeyConcurrent string
	Days                          int
	UsageUnavailable              bool
	// UsageOff: unavailable until the operator corrects clickhouse.dsn,
	// not because ClickHouse is down.
	UsageOff                   bool
	PerDay, PerModel, PerMonth []usageLine
	Months                     int
	Total                      usageLine
}

type usageLine struct {
	Label, Requests, Prompt, Cached, Completion, Cost string
	Estimated                                         uint64 // 0 hides the note
}

func lineOf(t usageTotals) usageLine {
	return usageLine{Label: t.Label, Requests: thousands(int64(t.Requests)), Prompt: thousands(t.Prompt),
		Cached: thousands(t.Cached), Completion: thousands(t.Completion), Estimated: t.Estimated, Cost: usd(t.Cost)}
}

type keysPage struct {
	BaseURL string
	Keys    []keyLine
	// DeletedNotShown is how many deleted keys the list leaves out, ""
	// when none.
	DeletedNotShown string
	Form            keyForm
}

// keyLine describes a key; it has no field that could hold the token.
type keyLine struct {
	ID, Name, Scopes, Models, Limits, Logging, Created, Status, StatusClass string
	Active                                                                  bool // not deleted yet: offer to delete it
}

type keyForm struct {
	// Token makes this rendering of the form one of its own: sent twice,
	// it makes one key (see keyForms).
	Token     string
	Name      string
	Scopes    []scopeChoice
	Models    []modelChoice
	ModelRows int
	Logging   bool
	Retention string
}

type scopeChoice struct {
	Name, Help string
	Checked    bool
}

type modelChoice struct {
	ID       string
	Selected bool
}

var scopeHelp = map[string]string{
	accounts.ScopeGenerate: "chat completions and responses (/v1/chat/completions, /v1/responses)",
	accounts.ScopeClassify: "classify, tag, score and match",
	accounts.ScopeBatch:    "batch jobs (/v1/batch)",
	accounts.ScopeConsole:  "reserved: no route needs it yet (signing in to this console needs no key)",
}

type createdPage struct {
	Name, KeyID, Token, BaseURL string
}

// resentPage answers a key form sent again; KeyID is empty when the key
// it made is not known (not noted yet, or not found).
type resentPage struct {
	KeyID, Name string
	Active      bool // not deleted yet: offer to delete it
}

type revokePage struct {
	ID, Name string
}

func (c *Console) render(ctx *fasthttp.RequestCtx, status int, name string, data pageData) {
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		c.logf("console: rendering %s: %v", name, err)
		ctx.SetStatusCode(500)
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("the console could not render this page; the gateway log says why")
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("text/html; charset=utf-8")
	ctx.SetBody(buf.Bytes())
}

// message answers with a page that says what happened. It is a console
// page like the others, and leads back: signed in, it has the navigation
// and a link to the overview (to API keys from the keys pages); signed
// out, a link to how to sign in. Error pages had neither, and a holder
// who met one had to edit the address to go on.
func (c *Console) message(ctx *fasthttp.RequestCtx, status int, heading, text string, signInHelp bool) {
	c.messageWords(ctx, status, heading, plain(text), signInHelp)
}

// messageWords is message whose text holds what a user wrote.
func (c *Console) messageWords(ctx *fasthttp.RequestCtx, status int, heading string, text words, signInHelp bool) {
	page := messagePage{Heading: heading, Text: text, SignInHelp: signInHelp}
	data := pageData{Title: heading}
	if sess, ok := c.signedIn(ctx); ok {
		data = c.pageData(sess, heading, "", nil)
		page.Back = backLink{"/console", "Back to the overview"}
		if path := string(ctx.Path()); path == "/console/keys" || strings.HasPrefix(path, "/console/keys/") {
			page.Back = backLink{"/console/keys", "Back to API keys"}
		}
	} else if string(ctx.RequestURI()) != "/console/login" { // that page is how to sign in
		page.Back = backLink{"/console/login", "How to sign in"}
	}
	data.Page = page
	c.render(ctx, status, "message", data)
}

// usd shows nano-USD as a decimal with 2 to 9 places: exact, and short
// for round amounts ("4.99", "0.0012345"), its whole dollars grouped as
// thousands groups counts ("1,234,568.49").
func usd(n money.Nanos) string {
	s := n.String() // nine places
	trimmed := strings.TrimRight(s, "0")
	if dot := strings.IndexByte(s, '.'); len(trimmed) < dot+3 {
		trimmed = s[:dot+3]
	}
	whole, fraction, _ := strings.Cut(trimmed, ".")
	return groupDigits(whole) + "." + fraction
}

// thousands groups digits by three with commas: 1234567 → "1,234,567".
func thousands(n int64) string { return groupDigits(strconv.FormatInt(n, 10)) }

// groupDigits groups a whole number written in digits, with its sign, by
// three with commas.
func groupDigits(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	var b strings.Builder
	for i, d := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return sign + b.String()
}

func describeKey(k accounts.KeyInfo, now time.Time) keyLine {
	line := keyLine{ID: k.KeyID, Name: k.Name, Created: k.CreatedAt.UTC().Format("2006-01-02 15:04 UTC"),
		Scopes: "all scopes", Models: "all models", Limits: keyLimitsText(k.RPM, k.TPM), Logging: "off", Status: "active", StatusClass: "active", Active: true}
	if len(k.Scopes) > 0 {
		line.Scopes = strings.Join(k.Scopes, ", ")
	}
	if len(k.Models) > 0 {
		line.Models = strings.Join(k.Models, ", ")
	}
	if k.Logging.Enabled {
		// Not "until deleted": deleting the key leaves its logs, and the
		// holder cannot delete them.
		line.Logging = "on, kept with no expiry"
		if k.Logging.RetentionDays > 0 {
			line.Logging = "on, kept " + strconv.Itoa(k.Logging.RetentionDays) + " days"
			if k.Logging.RetentionDays == 1 {
				line.Logging = "on, kept 1 day"
			}
		}
	}
	switch {
	case k.RevokedAt != nil:
		line.Status, line.StatusClass, line.Active = "deleted "+k.RevokedAt.UTC().Format("2006-01-02 15:04 UTC"), "revoked", false
	case k.ExpiresAt != nil && !now.Before(*k.ExpiresAt):
		line.Status, line.StatusClass = "expired "+k.ExpiresAt.UTC().Format("2006-01-02 15:04 UTC"), "expired"
	case k.ExpiresAt != nil:
		line.Status = "active until " + k.ExpiresAt.UTC().Format("2006-01-02 15:04 UTC")
	}
	return line
}

// keyLimitsText is a key's own rpm and tpm as the list shows them. Keys
// made by the operator (CLI, admin API) may have them; the console's form
// makes none.
func keyLimitsText(rpm, tpm int64) string {
	switch {
	case rpm > 0 && tpm > 0:
		return thousands(rpm) + " requests and " + thousands(tpm) + " tokens a minute"
	case rpm > 0:
		return thousands(rpm) + " requests a minute"
	case tpm > 0:
		return thousands(tpm) + " tokens a minute"
	}
	return "none of its own"
}
