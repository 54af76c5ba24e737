package console

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// chromiumPath is Debian's chromium, which `make test` installs.
const chromiumPath = "/usr/bin/chromium"

// The whole journey in a real browser: sign in with a link from the admin
// API, see balance and usage from ClickHouse, create a key, use it with the
// OpenAI SDK, delete it, and see the SDK get 401.
func TestBrowserCreateUseAndDeleteKey(t *testing.T) {
	ch := chtest.Start(t)
	wantTotal := insertUsage(t, ch.DSN())
	g := startGateway(t, ch.DSN())
	link := g.loginURL("acme")
	ctx := newTab(t)

	do := func(step string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	text := func(selector string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(selector)))
		if err != nil {
			t.Fatalf("reading %s: %v", selector, err)
		}
		return strings.TrimSpace(s)
	}

	do("signing in", chromedp.Navigate(link), chromedp.Click(chromedp.ID("sign-in")), chromedp.WaitVisible(chromedp.ID("balance")))
	if got := text("#balance"); got != "10.00" {
		t.Fatalf("balance %q, want 10.00", got)
	}
	if got := text("#usage-total-cost"); got != wantTotal {
		t.Fatalf("30-day cost %q, want %q (FINAL drops the duplicate; other accounts and older days excluded)", got, wantTotal)
	}
	perModel := text("#usage-per-model tbody")
	if !strings.Contains(perModel, "large") || !strings.Contains(perModel, "small") || strings.Contains(perModel, "secret-model") {
		t.Fatalf("per-model usage: %q", perModel)
	}
	// Plugin calls, billed at the plugin price (or the model's, when
	// higher), on a line of their own; cached tokens and estimated calls
	// said.
	if !strings.Contains(perModel, "small (classify)") {
		t.Fatalf("per-model usage without the classify line: %q", perModel)
	}
	if usage := text("#usage-heading + p, #usage-heading ~ p"); !strings.Contains(usage, "1 of the calls was billed on tokens the gateway counted") {
		t.Fatalf("usage note: %q", usage)
	}
	// Months reach further back: the 40-day-old call is in its month's
	// total.
	old := time.Now().UTC().Add(-40 * 24 * time.Hour).Format("2006-01")
	if months := text("#usage-per-month tbody"); !strings.Contains(months, old) || !strings.Contains(months, "7.00") ||
		!strings.Contains(months, time.Now().UTC().Format("2006-01")+" (so far)") {
		t.Fatalf("per-month usage: %q", months)
	}
	if days := text("#usage-per-day tbody"); strings.Count(days, "\n") != 1 {
		t.Fatalf("per-day usage, want 2 days: %q", days)
	}

	do("creating a key",
		chromedp.Click(chromedp.CSS(`nav a[href="/console/keys"]`)),
		chromedp.WaitVisible(chromedp.ID("create-key")),
		chromedp.SendKeys(chromedp.ID("name"), "ci"),
		chromedp.Click(chromedp.ID("create")),
		chromedp.WaitVisible(chromedp.ID("new-key")),
		// Visible only if the inline script ran, i.e. the CSP allows it.
		chromedp.WaitVisible(chromedp.ID("copy")),
	)
	token, err := chromedp.Run(ctx, chromedp.Value(chromedp.ID("new-key")))
	if err != nil {
		t.Fatal(err)
	}
	key, err := g.svc.Verify([]byte(token))
	if err != nil {
		t.Fatalf("the key on the page does not verify: %v", err)
	}
	if key.Name != "ci" || strings.Join(key.Scopes, ",") != "generate" {
		t.Fatalf("created %+v, want name ci with scope generate only", key)
	}

	client := openai.NewClient(option.WithBaseURL(g.url+"/v1"), option.WithAPIKey(token), option.WithMaxRetries(0))
	chat := func() error {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "small",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		})
		return err
	}
	if err := chat(); err != nil {
		t.Fatalf("calling with the new key: %v", err)
	}

	do("listing keys", chromedp.Click(chromedp.ID("back-to-keys")), chromedp.WaitVisible(chromedp.ID("revoke-"+key.ID)))
	page, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page, token) {
		t.Fatal("the key list shows the key")
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100 means PNG
	if err != nil {
		t.Fatal(err)
	}
	shotPath := filepath.Join(t.TempDir(), "console-keys.png")
	if err := os.WriteFile(shotPath, shot, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of /console/keys: %s (%d bytes)", shotPath, len(shot))

	do("deleting the key",
		chromedp.Click(chromedp.ID("revoke-"+key.ID)),
		chromedp.WaitVisible(chromedp.ID("confirm-revoke")),
		chromedp.Click(chromedp.ID("confirm-revoke")),
		chromedp.WaitVisible(chromedp.CSS(".flash")),
	)
	checkFor(t, time.Second, 20*time.Millisecond, func() error {
		err := chat()
		var apiErr *openai.Error
		if errors.As(err, &apiErr) && apiErr.StatusCode == 401 {
			return nil
		}
		return errors.New("the deleted key is still accepted: " + errString(err))
	})

	if logs := g.log.String(); strings.Contains(logs, token) {
		t.Fatal("the key reached the log")
	}
}

// newTab starts a Chromium of its own (a fresh profile, extra flags added
// to the usual) and returns a tab's context, good for 30 seconds.
func newTab(t *testing.T, flags ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s is missing (%v): run make test, which installs Debian's chromium", chromiumPath, err)
	}
	opts := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	}, flags...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	t.Cleanup(cancelAlloc)
	tabCtx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelTab)
	ctx, cancel := context.WithTimeout(tabCtx, 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// insertUsage writes acme's usage (and distractors) into ClickHouse the way
// the billing consumer does, and returns acme's expected 30-day cost.
func insertUsage(t *testing.T, dsn string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sink, err := billing.OpenClickHouse(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if _, err := sink.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	event := func(account, model string, at time.Time, prompt, completion int64, cost int64) *meter.Event {
		return &meter.Event{ID: uuid.NewString(), Time: at, Account: account, KeyID: "key_test", Endpoint: "/v1/chat/completions",
			Model: model, Upstream: "local", PromptTokens: prompt, CompletionTokens: completion, CostNanos: money.Nanos(cost),
			UsageSource: meter.SourceUpstream, Status: 200}
	}
	today := event("acme", "small", now, 1000, 500, 250_000)
	classify := event("acme", "small", now, 40, 0, 4_000) // the plugin price
	classify.Endpoint = "/v1/classify"
	cut := event("acme", "large", now, 300, 20, 1_000) // a cut stream, counted by the gateway
	cut.UsageSource, cut.CachedTokens = meter.SourceEstimated, 100
	events := []*meter.Event{
		today, classify, cut,
		event("acme", "large", now, 2000, 1000, 3_000_000),
		event("acme", "small", now.Add(-24*time.Hour), 100, 50, 25_000),
		event("acme", "small", now.Add(-40*24*time.Hour), 1, 1, 7_000_000_000), // too old
		event("other", "secret-model", now, 5, 5, 999_000_000),                 // another account
	}
	if err := sink.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	// Redelivered by JetStream: a second row with the same id.
	if err := sink.Insert(ctx, []*meter.Event{today}); err != nil {
		t.Fatal(err)
	}
	return "0.00328"
}

// A signed-in account holder who followed a link to the console from
// another site (a mail, a chat, a wiki) got "Not signed in", reload or
// not: the session cookie was SameSite=Strict, which a browser leaves off
// every request a navigation from another site starts. With Lax the link
// works, and a form posted from that site is still refused.
func TestBrowserFollowsALinkFromAnotherSite(t *testing.T) {
	g := startGateway(t, "")
	link := g.loginURL("acme")
	ctx := newTab(t)
	do := func(step string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	page := func() string {
		t.Helper()
		got, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	do("signing in", chromedp.Navigate(link), chromedp.Click(chromedp.ID("sign-in")), chromedp.WaitVisible(chromedp.ID("balance")))
	do("opening the keys", chromedp.Navigate(g.url+"/console/keys"), chromedp.WaitVisible(chromedp.ID("create-key")))
	csrf, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`input[name="csrf"]`)))
	if err != nil {
		t.Fatal(err)
	}

	// The other site: "localhost" is another site than the gateway's
	// "127.0.0.1". Its form carries the session's real CSRF token, as if
	// it had leaked: the origin check alone must refuse it.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><a id="to-console" href="%[1]s/console">the console</a>
<form method="post" action="%[1]s/console/keys"><input name="csrf" value="%[2]s"><input name="name" value="forged">
<input name="scopes" value="generate"><button id="forge">Send</button></form>`, g.url, html.EscapeString(csrf))
	}))
	defer other.Close()
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)

	do("following a link from another site", chromedp.Navigate(otherURL), chromedp.Click(chromedp.ID("to-console")),
		chromedp.WaitVisible(chromedp.CSS("main h1")))
	if got := page(); !strings.Contains(got, `id="balance"`) {
		t.Fatalf("the console opened from another site's link is not signed in:\n%s", got)
	}

	do("posting a form from another site", chromedp.Navigate(otherURL), chromedp.Click(chromedp.ID("forge")),
		chromedp.WaitVisible(chromedp.ID("message")))
	if got := page(); !strings.Contains(got, "This form was sent from another site.") {
		t.Fatalf("a form from another site was not refused:\n%s", got)
	}
	if keys, err := g.svc.ListKeys(t.Context(), "acme"); err != nil || len(keys) != 0 {
		t.Fatalf("a form from another site created keys %+v (%v)", keys, err)
	}
}

// With JavaScript off the key-created page showed a Copy button that did
// nothing: the stylesheet's display: inline-block for buttons overrode
// the hidden attribute the script would have removed.
func TestBrowserWithoutJavaScriptHidesTheCopyButton(t *testing.T) {
	g := startGateway(t, "")
	link := g.loginURL("acme")
	ctx := newTab(t, chromedp.Flag("blink-settings", "scriptEnabled=false"))
	err := chromedp.Do(ctx,
		chromedp.Navigate(link), chromedp.Click(chromedp.ID("sign-in")), chromedp.WaitReady(chromedp.ID("balance")),
		chromedp.Navigate(g.url+"/console/keys"),
		chromedp.SendKeys(chromedp.ID("name"), "ci"),
		chromedp.Click(chromedp.ID("create")),
		chromedp.WaitReady(chromedp.ID("new-key")),
	)
	if err != nil {
		t.Fatalf("creating a key without JavaScript: %v", err)
	}
	// The computed style comes from the CSS domain: no script of the
	// page's or of chromedp's runs to read it.
	style, err := chromedp.Run(ctx, chromedp.ComputedStyle(chromedp.ID("copy")))
	if err != nil {
		t.Fatal(err)
	}
	display := "(not computed)"
	for _, p := range style {
		if p.Name == "display" {
			display = p.Value
		}
	}
	if display != "none" {
		t.Fatalf("the Copy button shows (display: %s) though no script can make it work", display)
	}
	if token, err := chromedp.Run(ctx, chromedp.Value(chromedp.ID("new-key"))); err != nil || !strings.HasPrefix(token, accounts.TokenPrefix) {
		t.Fatalf("the key is not in its field without JavaScript: %q (%v)", token, err)
	}
}
