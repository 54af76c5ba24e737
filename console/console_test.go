package console

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/net/html"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/money"
)

func TestSignInLinkWorksOnceAndIsStoredOnlyAsHash(t *testing.T) {
	g := startGateway(t, "")
	resp := g.admin("POST", "/admin/v1/accounts/acme/console-login")
	body := readAll(t, resp)
	if resp.StatusCode != 201 {
		t.Fatalf("console-login: %d %s", resp.StatusCode, body)
	}
	var issued struct {
		Account   string    `json:"account"`
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(body, &issued); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(issued.URL, g.url+"/console/login?token=tgl-") {
		t.Fatalf("url %q", issued.URL)
	}
	if d := time.Until(issued.ExpiresAt); d < 14*time.Minute || d > 15*time.Minute {
		t.Fatalf("expires in %s, want 15 minutes", d)
	}
	token := tokenOf(t, issued.URL)

	// The bucket holds the token's SHA-256 and the account, never the token.
	kv, err := g.broker.JetStream().KeyValue(t.Context(), BucketLogins)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(t.Context(), loginKey(token))
	if err != nil {
		t.Fatalf("no entry under the token's hash: %v", err)
	}
	if strings.Contains(string(entry.Value()), token) || strings.Contains(entry.Key(), token) {
		t.Fatalf("the bucket holds the token itself: %s", entry.Value())
	}

	b := g.browser()
	// Opening the link only shows a button; it can be opened again.
	for range 2 {
		if status, page := b.get("/console/login?token=" + token); status != 200 || !strings.Contains(page, `id="sign-in"`) {
			t.Fatalf("sign-in page: %d %s", status, page)
		}
	}
	resp = b.post("/console/login", url.Values{"token": {token}})
	readAll(t, resp)
	if resp.StatusCode != 303 {
		t.Fatalf("sign in: %d", resp.StatusCode)
	}
	setCookie := resp.Header.Get("Set-Cookie")
	for _, want := range []string{cookieName + "=", "HttpOnly", "SameSite=Lax", "path=/console"} {
		if !strings.Contains(setCookie, want) {
			t.Errorf("Set-Cookie %q lacks %q", setCookie, want)
		}
	}
	if status, page := b.get("/console"); status != 200 || !strings.Contains(page, `<span id="balance">10.00</span>`) {
		t.Fatalf("overview: %d %s", status, page)
	}

	// Used up: neither the page nor the exchange accepts it again, and a
	// fresh browser gets no session from it.
	if status, _ := b.get("/console/login?token=" + token); status != 401 {
		t.Fatalf("used link page: %d, want 401", status)
	}
	other := g.browser()
	resp = other.post("/console/login", url.Values{"token": {token}})
	if page := readAll(t, resp); resp.StatusCode != 401 || !strings.Contains(string(page), "already used") {
		t.Fatalf("second redeem: %d %s", resp.StatusCode, page)
	}
	if other.cookie() != nil {
		t.Fatal("a used link still set a session cookie")
	}

	if resp := g.admin("POST", "/admin/v1/accounts/nobody/console-login"); resp.StatusCode != 404 {
		t.Fatalf("link for a missing account: %d, want 404", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", g.url+"/admin/v1/accounts/acme/console-login", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 401 {
		t.Fatalf("link without the admin token: %d, want 401", resp.StatusCode)
	}
}

// Gateways redeeming one link at the same moment: one session, never two.
func TestSignInLinkRedeemedConcurrentlyWorksOnce(t *testing.T) {
	g := startGateway(t, "")
	for range 20 {
		token, _, err := g.console.logins.IssueLogin(t.Context(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range 8 {
			wg.Go(func() {
				<-start
				if account, err := g.console.logins.Redeem(context.Background(), token); err == nil && account == "acme" {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		if wins != 1 {
			t.Fatalf("%d redeems of one token succeeded, want 1", wins)
		}
	}
}

func TestSignInLinkExpires(t *testing.T) {
	g := startGateway(t, "")
	link := g.loginURL("acme")
	token := tokenOf(t, link)
	// Age the record as 15 minutes would: the bucket's own TTL is not exact
	// to the second, the stored expiry is.
	kv, err := g.broker.JetStream().KeyValue(t.Context(), BucketLogins)
	if err != nil {
		t.Fatal(err)
	}
	aged, _ := json.Marshal(loginRecord{Account: "acme", ExpiresAt: time.Now().Add(-time.Second)})
	if _, err := kv.Put(t.Context(), loginKey(token), aged); err != nil {
		t.Fatal(err)
	}
	b := g.browser()
	if status, page := b.get("/console/login?token=" + token); status != 401 || !strings.Contains(page, "expired") {
		t.Fatalf("expired link page: %d %s", status, page)
	}
	resp := b.post("/console/login", url.Values{"token": {token}})
	readAll(t, resp)
	if resp.StatusCode != 401 || b.cookie() != nil {
		t.Fatalf("expired link signed in: %d", resp.StatusCode)
	}
	// Malformed and unknown tokens are refused the same way.
	for _, bad := range []string{"", "tgl-short", "tg-" + strings.Repeat("a", 43), "tgl-" + strings.Repeat("A", 43)} {
		resp := b.post("/console/login", url.Values{"token": {bad}})
		readAll(t, resp)
		if resp.StatusCode != 401 {
			t.Errorf("token %q: %d, want 401", bad, resp.StatusCode)
		}
	}
}

func TestFormsRefuseMissingWrongOrCrossSiteCSRF(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	csrf := b.csrf()
	other := g.browser()
	other.signIn("acme") // same account, another sign-in: another token
	otherCSRF := other.csrf()
	if otherCSRF == csrf {
		t.Fatal("two sign-ins share one CSRF token")
	}
	form := func(token string) url.Values {
		return url.Values{"csrf": {token}, "name": {"x"}, "scopes": {"generate"}}
	}
	cases := []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"no token", url.Values{"name": {"x"}, "scopes": {"generate"}}, nil},
		{"wrong token", form("AAAA"), nil},
		{"another session's token", form(otherCSRF), nil},
		{"other origin", form(csrf), []string{"Origin", "http://evil.example"}},
		{"cross-site fetch", form(csrf), []string{"Sec-Fetch-Site", "cross-site"}},
	}
	for _, tc := range cases {
		resp := b.post("/console/keys", tc.form, tc.header...)
		page := string(readAll(t, resp))
		if resp.StatusCode != 403 {
			t.Errorf("%s: %d, want 403", tc.name, resp.StatusCode)
		}
		// A missing token is said to be missing, not "expired".
		if tc.name == "no token" && !strings.Contains(page, "without its security token") {
			t.Errorf("no token: %.300s", page)
		}
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("a refused form created %d keys", len(keys))
	}
	resp := b.post("/console/logout", url.Values{})
	readAll(t, resp)
	if resp.StatusCode != 403 {
		t.Fatalf("logout without token: %d, want 403", resp.StatusCode)
	}
	// The sign-in form has no session yet: the origin check guards it.
	resp = g.browser().post("/console/login", url.Values{"token": {tokenOf(t, g.loginURL("acme"))}}, "Origin", "http://evil.example")
	readAll(t, resp)
	if resp.StatusCode != 403 {
		t.Fatalf("cross-site sign-in: %d, want 403", resp.StatusCode)
	}

	resp = b.post("/console/keys", b.keyForm(url.Values{"name": {"x"}, "scopes": {"generate"}}))
	page := string(readAll(t, resp))
	if resp.StatusCode != 200 || !strings.Contains(page, `id="new-key"`) {
		t.Fatalf("create with the right token: %d %s", resp.StatusCode, page)
	}
	copied := b.cookie()
	resp = b.post("/console/logout", url.Values{"csrf": {csrf}})
	readAll(t, resp)
	if resp.StatusCode != 200 || b.cookie() != nil {
		t.Fatalf("logout: %d, cookie %v", resp.StatusCode, b.cookie())
	}
	if status, _ := b.get("/console"); status != 401 {
		t.Fatalf("after logout: %d, want 401", status)
	}
	// A copy of the cookie taken before signing out is refused too, here
	// and by every other gateway on the same NATS: it was valid for the
	// rest of its 8 hours.
	req, _ := http.NewRequest("GET", g.url+"/console", nil)
	req.AddCookie(copied)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 401 || !strings.Contains(string(body), "signed out") {
		t.Fatalf("the signed-out session's cookie: %d %s", resp.StatusCode, body)
	}
	second := startSecondGateway(t, g).console
	sess, err := g.console.sessions.verify(copied.Value)
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !second.signOuts.signedOut(sess) {
			return errors.New("another gateway still takes the signed-out session")
		}
		return nil
	})
}

// staleReplica answers every get not found, as a replica a few
// milliseconds behind the leader answers a direct get of a key just
// written.
type staleReplica struct{ jetstream.KeyValue }

func (staleReplica) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	return nil, jetstream.ErrKeyNotFound
}

// A sign-in link made through one gateway and opened at once on another
// was "invalid, has expired or was already used" when a replica behind
// the leader answered the read (3 in 40 on a 3-node cluster; sent again
// 200 ms later it worked). The leader confirms a miss; when it cannot be
// asked, the page says to try again, not that the link is bad.
func TestSignInLinkJustMadeWorksThroughAStaleReplica(t *testing.T) {
	first := startGateway(t, "")
	second := startSecondGateway(t, first)
	logins := second.console.logins
	// A stale replica stands for a replicated bucket.
	logins.kv, logins.replicated = staleReplica{logins.kv}, true

	link := func() string {
		resp := first.admin("POST", "/admin/v1/accounts/acme/console-login")
		body := readAll(t, resp)
		var issued struct{ URL string }
		if err := json.Unmarshal(body, &issued); err != nil || resp.StatusCode != 201 {
			t.Fatalf("console-login: %d %s", resp.StatusCode, body)
		}
		return tokenOf(t, issued.URL)
	}
	token := link()
	b := second.browser()
	if status, page := b.get("/console/login?token=" + token); status != 200 || !strings.Contains(page, `id="sign-in"`) {
		t.Fatalf("the sign-in page of a link just made, on a stale replica: %d %s", status, page)
	}
	resp := b.post("/console/login", url.Values{"token": {token}})
	if page := readAll(t, resp); resp.StatusCode != 303 {
		t.Fatalf("signing in with a link just made, on a stale replica: %d %s", resp.StatusCode, page)
	}
	resp = second.browser().post("/console/login", url.Values{"token": {token}})
	if page := readAll(t, resp); resp.StatusCode != 401 || !strings.Contains(string(page), "already used") {
		t.Fatalf("the used link again: %d %s", resp.StatusCode, page)
	}

	unanswered, err := jetstream.NewWithAPIPrefix(second.broker.Conn(), "$NOBODY.API")
	if err != nil {
		t.Fatal(err)
	}
	logins.js = unanswered
	token = link()
	if status, page := second.browser().get("/console/login?token=" + token); status != 503 || !strings.Contains(page, "Try again") {
		t.Fatalf("a link the leader could not be asked about: %d %s, want 503 Try again", status, page)
	}
	resp = second.browser().post("/console/login", url.Values{"token": {token}})
	if page := readAll(t, resp); resp.StatusCode != 503 {
		t.Fatalf("signing in with a link the leader could not be asked about: %d %s, want 503", resp.StatusCode, page)
	}
}

// TestGatewaysMustShareTheConsoleSecret: a second gateway given the
// shared signing.key but not console.secret made a secret of its own and
// refused every session the first had begun (401, "its console secret
// differs"): behind a load balancer, account holders were signed out at
// random. It is refused at start, naming the file to copy and how to
// replace the secret on purpose; given the copy, it serves the first's
// sessions. What the gateways publish is not the secret.
func TestGatewaysMustShareTheConsoleSecret(t *testing.T) {
	first := startGateway(t, "")
	forgot := t.TempDir()
	_, refused := Open(t.Context(), Options{Accounts: first.svc, JetStream: first.broker.JetStream(), Replicas: 1, DataDir: forgot})
	if refused == nil {
		t.Fatal("a gateway with a console secret of its own started beside the first")
	}
	for _, want := range []string{filepath.Join(forgot, SecretFile) + " (fingerprint ", "Copy console.secret into " + forgot,
		"nats kv del TOLLGATE_CONSOLE_SECRET fingerprint"} {
		if !strings.Contains(refused.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, refused)
		}
	}

	second := startSecondGateway(t, first)
	holder := first.browser()
	holder.signIn("acme")
	req, _ := http.NewRequest("GET", second.url+"/console", nil)
	req.AddCookie(holder.cookie())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("the second gateway, given the first's session: %d %s", resp.StatusCode, body)
	}

	kv, err := first.broker.JetStream().KeyValue(t.Context(), "TOLLGATE_CONSOLE_SECRET")
	if err != nil {
		t.Fatal(err)
	}
	published, err := kv.Get(t.Context(), "fingerprint")
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range [][]byte{first.console.sessions.secret, []byte(hex.EncodeToString(first.console.sessions.secret))} {
		if bytes.Contains(published.Value(), secret) || strings.Contains(refused.Error(), string(secret)) {
			t.Fatalf("the console secret is published or shown: %q", published.Value())
		}
	}

	// Replaced on purpose: once the fingerprint is deleted, the next
	// gateway to start publishes its own.
	if err := kv.Delete(t.Context(), "fingerprint"); err != nil {
		t.Fatal(err)
	}
	replaced, err := Open(t.Context(), Options{Accounts: first.svc, JetStream: first.broker.JetStream(), Replicas: 1, DataDir: forgot})
	if err != nil {
		t.Fatalf("a new secret after the fingerprint was deleted: %v", err)
	}
	replaced.Close()
}

func TestSessionExpiresAndForgedSessionsAreRefused(t *testing.T) {
	g := startGateway(t, "")
	signer := g.console.sessions
	signer.now = func() time.Time { return time.Now().Add(-DefaultSessionTTL - time.Second) }
	expired, _, err := signer.issue("acme", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	live, _, err := g.console.sessions.issue("acme", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// The same payload for another account, keeping acme's signature.
	parts := strings.Split(live, ".")
	forgedAccount := strings.Join(append([]string{"b3RoZXI"}, parts[1:]...), ".")
	// A later expiry, keeping the signature.
	forgedExpiry := strings.Join([]string{parts[0], "9999999999", parts[2], parts[3]}, ".")
	foreign := (&sessions{secret: []byte(strings.Repeat("k", 32)), ttl: time.Hour, now: time.Now})
	foreignValue, _, _ := foreign.issue("acme", time.Time{})

	get := func(cookie string) (int, string, string) {
		req, _ := http.NewRequest("GET", g.url+"/console", nil)
		req.AddCookie(&http.Cookie{Name: cookieName, Value: cookie})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(readAll(t, resp)), resp.Header.Get("Set-Cookie")
	}
	status, page, setCookie := get(expired)
	if status != 401 || !strings.Contains(page, "Session expired") {
		t.Fatalf("expired session: %d %s", status, page)
	}
	if !strings.Contains(setCookie, cookieName+"=;") || !strings.Contains(setCookie, "expires=Tue, 10 Nov 2009") {
		t.Errorf("expired session cookie not cleared: %q", setCookie)
	}
	for name, value := range map[string]string{"other account": forgedAccount, "later expiry": forgedExpiry,
		"other secret": foreignValue, "garbage": "x.y.z"} {
		if status, page, _ := get(value); status != 401 || strings.Contains(page, `id="balance"`) {
			t.Errorf("%s: %d, want 401", name, status)
		}
	}
	if status, page, _ := get(live); status != 200 || !strings.Contains(page, `id="balance"`) {
		t.Fatalf("live session: %d %s", status, page)
	}
}

func TestAnotherAccountsKeyIsNotFound(t *testing.T) {
	g := startGateway(t, "")
	theirs, theirToken, err := g.svc.CreateKey(t.Context(), "other", accounts.KeyRequest{Name: "theirs"})
	if err != nil {
		t.Fatal(err)
	}
	b := g.browser()
	b.signIn("acme")
	csrf := b.csrf()
	if _, page := b.get("/console/keys"); strings.Contains(page, theirs.KeyID) {
		t.Fatal("acme's key list shows other's key")
	}
	if status, _ := b.get("/console/keys/revoke?key_id=" + theirs.KeyID); status != 404 {
		t.Fatalf("confirm page for other's key: %d, want 404", status)
	}
	for _, id := range []string{theirs.KeyID, "key_doesnotexist", "../../x"} {
		resp := b.post("/console/keys/revoke", url.Values{"csrf": {csrf}, "key_id": {id}})
		page := string(readAll(t, resp))
		if resp.StatusCode != 404 || !strings.Contains(page, "No such key") {
			t.Fatalf("revoke %s: %d %s", id, resp.StatusCode, page)
		}
	}
	info, _ := g.svc.KeyInfo(theirs.KeyID)
	if info.RevokedAt != nil {
		t.Fatal("other's key was revoked from acme's session")
	}
	if _, err := g.svc.Verify([]byte(theirToken)); err != nil {
		t.Fatalf("other's key stopped working: %v", err)
	}
}

func TestCreateListAndRevokeKeyWithoutClickHouse(t *testing.T) {
	g := startGateway(t, "clickhouse://127.0.0.1:1/default") // nothing listens there
	b := g.browser()
	b.signIn("acme")
	status, page := b.get("/console")
	if status != 200 || !strings.Contains(page, `id="usage-unavailable"`) || !strings.Contains(page, `<span id="balance">10.00</span>`) {
		t.Fatalf("overview without ClickHouse: %d %s", status, page)
	}
	csrf := b.csrf()

	// A rejected form comes back with the problem and the input kept.
	resp := b.post("/console/keys", url.Values{"csrf": {csrf}, "name": {"ci"}, "scopes": {"generate"}, "models": {"gpt-4o"}})
	page = string(readAll(t, resp))
	if resp.StatusCode != 400 || !strings.Contains(page, `Model &#34;gpt-4o&#34; is not in the catalog`) || !strings.Contains(page, `value="ci"`) {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, page)
	}
	resp = b.post("/console/keys", url.Values{"csrf": {csrf}, "name": {"ci"}})
	if page := string(readAll(t, resp)); resp.StatusCode != 400 || !strings.Contains(page, "at least one scope") {
		t.Fatalf("no scope: %d %s", resp.StatusCode, page)
	}

	resp = b.post("/console/keys", b.keyForm(url.Values{"name": {"ci"}, "scopes": {"generate", "batch"},
		"models": {"small"}, "logging": {"on"}, "retention_days": {"30"}}))
	page = string(readAll(t, resp))
	if resp.StatusCode != 200 {
		t.Fatalf("create: %d %s", resp.StatusCode, page)
	}
	token := between(page, `id="new-key" class="secret" readonly autocomplete="off" spellcheck="false" value="`, `"`)
	key, err := g.svc.Verify([]byte(token))
	if err != nil {
		t.Fatalf("the shown key does not verify: %v (page %s)", err, page)
	}
	if key.Account != "acme" || key.Name != "ci" || strings.Join(key.Scopes, ",") != "batch,generate" || strings.Join(key.Models, ",") != "small" {
		t.Fatalf("created key %+v", key)
	}
	info, _ := g.svc.KeyInfo(key.ID)
	if !info.Logging.Enabled || info.Logging.RetentionDays != 30 {
		t.Fatalf("logging %+v", info.Logging)
	}
	for _, advice := range []string{"only time the key is shown", "environment variable", "separate key for each environment", "Rotate keys"} {
		if !strings.Contains(page, advice) {
			t.Errorf("created page lacks %q", advice)
		}
	}

	// The list shows metadata, never the key.
	_, list := b.get("/console/keys")
	if strings.Contains(list, token) || strings.Contains(list, token[len(token)-20:]) {
		t.Fatal("the key list shows the key")
	}
	for _, want := range []string{key.ID, "batch, generate", "on, kept 30 days", `class="status">active<`} {
		if !strings.Contains(list, want) {
			t.Errorf("key list lacks %q", want)
		}
	}

	status, confirm := b.get("/console/keys/revoke?key_id=" + key.ID)
	if status != 200 || !strings.Contains(confirm, `id="confirm-revoke"`) {
		t.Fatalf("confirm page: %d %s", status, confirm)
	}
	if info, _ := g.svc.KeyInfo(key.ID); info.RevokedAt != nil {
		t.Fatal("opening the confirmation revoked the key")
	}
	resp = b.post("/console/keys/revoke", url.Values{"csrf": {csrf}, "key_id": {key.ID}})
	readAll(t, resp)
	if resp.StatusCode != 303 || resp.Header.Get("Location") != "/console/keys?deleted="+key.ID {
		t.Fatalf("revoke: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if _, err := g.svc.Verify([]byte(token)); err == nil {
		t.Fatal("revoked key still verifies")
	}
	_, list = b.get("/console/keys?deleted=" + key.ID)
	if !strings.Contains(list, `class="flash"`) || !strings.Contains(list, `class="revoked"`) || strings.Contains(list, `id="revoke-`+key.ID) {
		t.Fatalf("list after revoke: %s", list)
	}

	if logs := g.log.String(); strings.Contains(logs, token) || strings.Contains(logs, "tgl-") {
		t.Fatalf("a secret reached the log:\n%s", logs)
	}
}

// TestKeyFormStopsAtTheKeyCap: one login made 29,025 keys in 9.5 s, and
// the keys page grew to 15 MB. Past auth.max_keys_per_account the form
// comes back with a 409 saying so, the input kept, and nothing created;
// deleting a key frees a place.
func TestKeyFormStopsAtTheKeyCap(t *testing.T) {
	g := startGatewayWithSections(t, "clickhouse://127.0.0.1:1/default", "", "auth:\n  max_keys_per_account: 1\n")
	b := g.browser()
	b.signIn("acme")
	fields := url.Values{"name": {"ci"}, "scopes": {"classify"}}
	resp := b.post("/console/keys", b.keyForm(fields))
	if page := string(readAll(t, resp)); resp.StatusCode != 200 {
		t.Fatalf("first key: %d %s", resp.StatusCode, page)
	}
	refused := b.keyForm(fields)
	resp = b.post("/console/keys", refused)
	page := string(readAll(t, resp))
	if resp.StatusCode != 409 || !strings.Contains(page, "auth.max_keys_per_account") || !strings.Contains(page, "Delete a key") || !strings.Contains(page, `value="ci"`) {
		t.Fatalf("a key past the cap: %d %s", resp.StatusCode, page)
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys after the refusal: %+v %v", keys, err)
	}
	readAll(t, b.post("/console/keys/revoke", url.Values{"csrf": {b.csrf()}, "key_id": {keys[0].KeyID}}))
	// The form refused at the cap made no key: sent again, it is no
	// reload of a made key's page, and makes one.
	if resp := b.post("/console/keys", refused); resp.StatusCode != 200 {
		t.Fatalf("a key after deleting one: %d %s", resp.StatusCode, readAll(t, resp))
	}
}

// TestKeysPageShowsOnlyTheLatestDeletedKeys: deleted keys stay stored,
// and 19,000 of them made the keys page 8.3 MB, every one a row, though
// the count cap held. The page lists the keys in use and the latest
// deleted ones, and says how many it left out.
func TestKeysPageShowsOnlyTheLatestDeletedKeys(t *testing.T) {
	g := startGateway(t, "clickhouse://127.0.0.1:1/default")
	const deleted = deletedKeysShown + 5
	var ids []string
	for i := range deleted + 2 {
		info, _, err := g.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: fmt.Sprintf("k%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.KeyID)
	}
	for _, id := range ids[:deleted] {
		if _, err := g.svc.RevokeKey(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	b := g.browser()
	b.signIn("acme")
	status, page := b.get("/console/keys?deleted=" + ids[0])
	if status != 200 {
		t.Fatalf("keys page: %d %s", status, page)
	}
	if rows := strings.Count(page, `class="revoked"`); rows != deletedKeysShown {
		t.Errorf("%d deleted keys listed, want %d", rows, deletedKeysShown)
	}
	for _, id := range ids[deleted:] {
		if !strings.Contains(page, `id="revoke-`+id+`"`) {
			t.Errorf("key in use %s not listed", id)
		}
	}
	if !strings.Contains(page, `id="key-`+ids[deleted-1]+`"`) || strings.Contains(page, `id="key-`+ids[0]+`"`) {
		t.Error("the list does not hold the latest deleted keys")
	}
	if !strings.Contains(page, "5 older deleted keys are not shown") {
		t.Errorf("the page does not say how many deleted keys it left out: %s", page)
	}
	// The key just deleted may be one not shown; the page still says so.
	if !strings.Contains(page, `(`+ids[0]+`) is deleted`) {
		t.Error("no flash for a deleted key not listed")
	}
}

// TestKeyFormStopsAtTheKeysPerHour: past the count cap's reach, a loop
// of create and delete in the console grew the key store without end
// (deleted keys stay stored). Past auth.max_keys_created_per_hour the form
// comes back with a 429 saying so and when, the input kept, Retry-After and
// retry-after-ms set, and nothing created.
func TestKeyFormStopsAtTheKeysPerHour(t *testing.T) {
	g := startGatewayWithSections(t, "clickhouse://127.0.0.1:1/default", "", "auth:\n  max_keys_created_per_hour: 2\n")
	b := g.browser()
	b.signIn("acme")
	csrf := b.csrf()
	newKey := url.Values{"name": {"ci"}, "scopes": {"classify"}}
	for i := range 2 {
		resp := b.post("/console/keys", b.keyForm(newKey))
		if page := string(readAll(t, resp)); resp.StatusCode != 200 {
			t.Fatalf("key %d: %d %s", i+1, resp.StatusCode, page)
		}
		keys, err := g.svc.ListKeys(t.Context(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, b.post("/console/keys/revoke", url.Values{"csrf": {csrf}, "key_id": {keys[len(keys)-1].KeyID}}))
	}
	resp := b.post("/console/keys", b.keyForm(newKey))
	page := string(readAll(t, resp))
	if resp.StatusCode != 429 || !strings.Contains(page, "auth.max_keys_created_per_hour") || !strings.Contains(page, "minutes") || !strings.Contains(page, `value="ci"`) {
		t.Fatalf("a third key in the hour: %d %s", resp.StatusCode, page)
	}
	retryAfter, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	retryMS, _ := strconv.Atoi(resp.Header.Get("retry-after-ms"))
	if retryAfter < 3500 || retryAfter > 3600 || retryMS < 3_500_000 || retryMS > 3_600_000 {
		t.Errorf("Retry-After %q, retry-after-ms %q: want the hour less the moments since the first key",
			resp.Header.Get("Retry-After"), resp.Header.Get("retry-after-ms"))
	}
	if keys, err := g.svc.ListKeys(t.Context(), "acme"); err != nil || len(keys) != 2 {
		t.Fatalf("keys after the refusal: %d, %v; want the 2 made before", len(keys), err)
	}
}

// The key form and the admin API share one validation (admin.CheckKeyRequest):
// the rules on the name and the cap on retention hold here as they do
// there, and nothing is created.
func TestKeyFormRefusesTooLongNameAndRetention(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	csrf := b.csrf()
	for _, tc := range []struct {
		name string
		form url.Values
		want string
	}{
		{"name", url.Values{"name": {strings.Repeat("n", 201)}, "scopes": {"generate"}}, "Name is too long: at most 200 bytes."},
		// The form's name goes to the check as typed: the console trimmed
		// it, so "trail\n" passed here and not in the API.
		{"trailing newline", url.Values{"name": {"trail\n"}, "scopes": {"generate"}}, "Name must not contain control characters."},
		{"spaces at the ends", url.Values{"name": {" pad "}, "scopes": {"generate"}}, "Name must not begin or end with a space."},
		{"only spaces", url.Values{"name": {"  "}, "scopes": {"generate"}}, "Name is required"},
		{"C1 control", url.Values{"name": {"c1\u0085x"}, "scopes": {"generate"}}, "Name must not contain control characters."},
		{"bidi override", url.Values{"name": {"x\u202egpj.exe"}, "scopes": {"generate"}}, "Name must not contain bidirectional formatting characters"},
		{"invalid UTF-8", url.Values{"name": {"bad\xffname"}, "scopes": {"generate"}}, "Name must be valid UTF-8."},
		{"retention", url.Values{"name": {"ci"}, "scopes": {"generate"}, "logging": {"on"}, "retention_days": {"36501"}},
			"Logging retention must be a whole number of days from 0 to 36500"},
		// Not a number said "Retention must be", a number out of range
		// "Logging retention must be": the same words for both.
		{"retention not a number", url.Values{"name": {"ci"}, "scopes": {"generate"}, "logging": {"on"}, "retention_days": {"abc"}},
			"Logging retention must be a whole number of days from 0 to 36500"},
		// A checkbox sends "on": "yes" made a key with logging off.
		{"logging not on", url.Values{"name": {"ci"}, "scopes": {"generate"}, "logging": {"yes"}},
			"The field &#34;logging&#34; is &#34;on&#34; or left out; it was <bdi>&#34;yes&#34;</bdi>."},
		// Days typed with the box unticked: the API and the CLI refuse it.
		{"retention without logging", url.Values{"name": {"ci"}, "scopes": {"generate"}, "retention_days": {"30"}},
			"Logging retention (retention_days: 30) applies only when logging is enabled: enable logging, or leave retention_days at 0."},
	} {
		tc.form.Set("csrf", csrf)
		resp := b.post("/console/keys", tc.form)
		if page := string(readAll(t, resp)); resp.StatusCode != 400 || !strings.Contains(page, tc.want) {
			t.Fatalf("%s: %d, want 400 with %q:\n%s", tc.name, resp.StatusCode, tc.want, page)
		}
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("refused forms created keys: %+v", keys)
	}
}

func TestPagesSendProtectiveHeaders(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	resp, err := b.client.Get(g.url + "/console/keys")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	for header, want := range map[string]string{
		"Cache-Control":           "no-store",
		"Content-Security-Policy": "default-src 'none'; style-src 'self'",
		"X-Frame-Options":         "DENY",
		"Referrer-Policy":         "same-origin",
		"Content-Type":            "text/html; charset=utf-8",
	} {
		if got := resp.Header.Get(header); !strings.Contains(got, want) {
			t.Errorf("%s: %q, want %q", header, got, want)
		}
	}
	// A reverse proxy's own Authorization header is not an API key to check.
	req, _ := http.NewRequest("GET", g.url+"/console", nil)
	req.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
	resp, err = b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if page := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(string(page), `id="balance"`) {
		t.Fatalf("with a Basic Authorization header: %d %s", resp.StatusCode, page)
	}
	resp, err = b.client.Get(g.url + "/console/style.css")
	if err != nil {
		t.Fatal(err)
	}
	if css := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(string(css), "--text") || strings.Contains(string(css), "url(") {
		t.Fatalf("style.css: %d, or it fetches something", resp.StatusCode)
	}
}

func TestSecretIsCreatedOnceAndShared(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	secrets := make([][]byte, 4)
	for i := range secrets {
		wg.Go(func() {
			s, err := loadOrCreateSecret(dir)
			if err != nil {
				t.Error(err)
			}
			secrets[i] = s
		})
	}
	wg.Wait()
	for _, s := range secrets[1:] {
		if string(s) != string(secrets[0]) || len(s) != secretLen {
			t.Fatalf("gateways on one data dir got different secrets")
		}
	}
}

func TestSummarizeIsExact(t *testing.T) {
	rows := []usageRow{
		{Day: "2026-01-02", Model: "small", Requests: 2, Prompt: 10, Completion: 5, Cost: 1},
		{Day: "2026-01-02", Model: "large", Requests: 1, Prompt: 7, Completion: 3, Cost: 999_999_999},
		{Day: "2026-01-01", Model: "small", Requests: 1, Prompt: 1, Completion: 1, Cost: 100_000_000},
	}
	days, models, total := summarize(rows)
	if len(days) != 2 || days[0].Label != "2026-01-02" || days[0].Cost != 1_000_000_000 || days[0].Requests != 3 {
		t.Fatalf("days %+v", days)
	}
	if len(models) != 2 || models[0].Label != "large" || models[1].Cost != 100_000_001 {
		t.Fatalf("models %+v", models)
	}
	if total.Cost != 1_100_000_000 || usd(total.Cost) != "1.10" || total.Prompt != 18 {
		t.Fatalf("total %+v", total)
	}
	// Whole dollars grouped as token counts are (4,500,000): the balance
	// showed 1234568.49098195.
	for n, want := range map[money.Nanos]string{0: "0.00", 1: "0.000000001", 4_990_000_000: "4.99", -1_500_000: "-0.0015", 123_456_789_012: "123.456789012",
		1_234_568_490_981_950: "1,234,568.49098195", -1_234_500_000_000: "-1,234.50", 999_999_999_999: "999.999999999", 1000 * money.NanosPerUSD: "1,000.00"} {
		if got := usd(n); got != want {
			t.Errorf("usd(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -12345: "-12,345"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func between(s, start, end string) string {
	i := strings.Index(s, start)
	if i < 0 {
		return ""
	}
	s = s[i+len(start):]
	return s[:strings.Index(s, end)]
}

// "/console/" is typed as often as "/console": it leads to the overview.
func TestConsoleWithTrailingSlashLeadsToTheOverview(t *testing.T) {
	g := startGateway(t, "")
	resp, err := g.browser().client.Get(g.url + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 308 || resp.Header.Get("Location") != "/console" {
		t.Fatalf("GET /console/: %d, Location %q; want 308 to /console", resp.StatusCode, resp.Header.Get("Location"))
	}
	// Other paths under /console are pages too, not the API's JSON.
	b := g.browser()
	for _, path := range []string{"/console/foo", "/console/keys/"} {
		status, page := b.get(path)
		if status != 404 || !strings.Contains(page, "<html") || !strings.Contains(page, "No such page") {
			t.Errorf("GET %s: %d %.200s", path, status, page)
		}
	}
	// A bookmarked sign-out link is no missing page: signing out is a
	// form (a GET changes nothing), so it is a 405 that says where the
	// button is. It was a 404 "There is no console page at
	// /console/logout" while PUT there was a 405.
	status, page := b.get("/console/logout")
	if status != 405 || !strings.Contains(page, "<html") || !strings.Contains(page, "Sign out button") {
		t.Errorf("GET /console/logout: %d %.400s", status, page)
	}
}

// A path or key id of the address that is not UTF-8 was echoed as its
// bytes into the UTF-8 page (escaped, but not UTF-8), while %00 was shown
// as U+FFFD: each byte that is not UTF-8 is U+FFFD too.
func TestBytesNotUTF8InTheAddressAreShownAsReplacements(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	for path, want := range map[string]string{
		"/console/%ff%fe":                    "/console/\uFFFD\uFFFD",
		"/console/a%00b":                     "/console/a\uFFFDb",
		"/console/caf%C3%A9%C3":              "/console/café\uFFFD",
		"/console/keys/revoke?key_id=key%ff": "key\uFFFD",
	} {
		status, page := b.get(path)
		if status != 404 || !utf8.ValidString(page) || !strings.Contains(page, "<bdi>"+want+"</bdi>") {
			t.Errorf("GET %s: %d, valid UTF-8 %v, want %q shown:\n%.600q", path, status, utf8.ValidString(page), want, page)
		}
	}
}

// PUT and DELETE on a console path got the API's JSON 405, with "Allow:
// GET, GET, POST, POST": a page, with each method once. Allow names the
// methods of the page (PUT /console/style.css said "GET, POST", and POST
// there is a 404). A GET or POST of a page that does not take it was a
// 404 "no console page" (GET /console/logout, POST /console/style.css,
// POST /console/) where PUT was a 405: every method a page does not take
// is a 405. Its text said "The console's pages take POST only" of one
// page's methods: it says "This page takes".
func TestOtherMethodsGetAConsolePage(t *testing.T) {
	g := startGateway(t, "")
	for _, tc := range []struct{ method, path, allow string }{
		{"PUT", "/console/keys", "GET, HEAD, POST"},
		{"DELETE", "/console/keys/revoke", "GET, HEAD, POST"},
		{"DELETE", "/console", "GET, HEAD"},
		{"POST", "/console", "GET, HEAD"},
		{"PUT", "/console/style.css", "GET, HEAD"},
		{"POST", "/console/style.css", "GET, HEAD"},
		{"POST", "/console/", "GET, HEAD"},
		{"PUT", "/console/", "GET, HEAD"},
		{"PUT", "/console/logout", "POST"},
		{"GET", "/console/logout", "POST"},
		{"PATCH", "/console/login", "GET, HEAD, POST"},
	} {
		req, _ := http.NewRequest(tc.method, g.url+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page := string(readAll(t, resp))
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != tc.allow || !strings.Contains(page, "<html") ||
			!strings.Contains(page, "This page takes "+tc.allow+" only, not "+tc.method) || resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s %s: %d, Allow %q, X-Frame-Options %q; want 405, Allow %q and a page:\n%.300s",
				tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("X-Frame-Options"), tc.allow, page)
		}
	}
}

// Behind a proxy that ends TLS the gateway sees plain HTTP and the proxy's
// upstream address: with server.public_url, sign-in links carry the public
// address, the cookie is Secure, and forms from the public origin pass.
func TestPublicURLBehindATLSProxy(t *testing.T) {
	const public = "https://console.example.com"
	g := startGatewayWith(t, "", "  public_url: "+public+"\n")
	link := g.loginURL("acme")
	if !strings.HasPrefix(link, public+"/console/login?token=tgl-") {
		t.Fatalf("sign-in link %q, want it on %s", link, public)
	}
	b := g.browser()
	token := tokenOf(t, link)
	// Refused from another site still.
	resp := b.post("/console/login", url.Values{"token": {token}}, "Origin", "https://evil.example")
	if body := readAll(t, resp); resp.StatusCode != 403 {
		t.Fatalf("sign-in from another site: %d %s", resp.StatusCode, body)
	}
	// The proxy forwards the browser's Origin and its own Host.
	resp = b.post("/console/login", url.Values{"token": {token}}, "Origin", public)
	body := readAll(t, resp)
	if resp.StatusCode != 303 {
		t.Fatalf("sign-in from %s: %d %s", public, resp.StatusCode, body)
	}
	var secure bool
	for _, c := range resp.Cookies() {
		if c.Name == cookieName {
			secure = c.Secure
		}
	}
	if !secure {
		t.Fatalf("the session cookie is not Secure: %q", resp.Header.Values("Set-Cookie"))
	}
}

// The operator ends an account's console sessions and cancels its sign-in
// links: a leaked link or cookie had no remedy but replacing
// console.secret, which signed every account out.
func TestOperatorSignsAnAccountOut(t *testing.T) {
	g := startGateway(t, "")
	acme, other := g.browser(), g.browser()
	acme.signIn("acme")
	other.signIn("other")
	pending := g.loginURL("acme")
	otherLink := g.loginURL("other")

	resp := g.admin("POST", "/admin/v1/accounts/acme/console-logout")
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"links_cancelled":1`) {
		t.Fatalf("console-logout: %d %s", resp.StatusCode, body)
	}
	// In whole seconds, UTC, as the admin API's other times: it had
	// nanoseconds.
	var answer struct {
		EndedBefore string `json:"sessions_ended_before"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		t.Fatal(err)
	}
	if at, err := time.Parse(time.RFC3339, answer.EndedBefore); err != nil || !strings.HasSuffix(answer.EndedBefore, "Z") ||
		strings.Contains(answer.EndedBefore, ".") || !at.After(time.Now().Add(-2*time.Second)) {
		t.Fatalf("sessions_ended_before %q (%v), want a whole second in UTC at or after the sign-out", answer.EndedBefore, err)
	}
	if status, page := acme.get("/console"); status != 401 || !strings.Contains(page, "Signed out") {
		t.Fatalf("acme's session after the sign-out: %d %.300s", status, page)
	}
	// Another gateway learns it from the bucket.
	ttl := g.console.sessions.ttl
	elsewhere, err := openSignOuts(t.Context(), g.broker.JetStream(), 1, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.close()
	begunBefore := session{Account: "acme", Expires: time.Now().Add(ttl - time.Minute), nonce: "00"}
	checkFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if !elsewhere.signedOut(begunBefore) {
			return errors.New("another gateway still accepts acme's earlier session")
		}
		return nil
	})
	if elsewhere.signedOut(session{Account: "acme", Expires: time.Now().Add(ttl + time.Minute), nonce: "01"}) {
		t.Fatal("another gateway refuses a session begun after the sign-out")
	}
	if status, page := acme.get(strings.TrimPrefix(pending, g.url)); status == 200 && strings.Contains(page, `id="sign-in"`) {
		t.Fatalf("acme's pending link still works: %d", status)
	}
	// Other accounts are untouched.
	if status, page := other.get("/console"); status != 200 {
		t.Fatalf("other's session: %d %.300s", status, page)
	}
	if status, page := other.get(strings.TrimPrefix(otherLink, g.url)); status != 200 || !strings.Contains(page, `id="sign-in"`) {
		t.Fatalf("other's link: %d %.300s", status, page)
	}
	// A new link signs acme in again.
	fresh := g.browser()
	fresh.signIn("acme")
	if status, page := fresh.get("/console"); status != 200 {
		t.Fatalf("a new session after the sign-out: %d %.300s", status, page)
	}
	if resp := g.admin("POST", "/admin/v1/accounts/nobody/console-logout"); resp.StatusCode != 404 {
		t.Fatalf("unknown account: %d", resp.StatusCode)
	}
}

// A session's start is known to the second, and one begun just after the
// operator's sign-out, in its same second, read as begun before it: the
// link issued after "tollgate accounts logout" signed its holder in (303,
// a cookie) and the next page was 401 "This session was signed out". A
// session begun before the sign-out in that second is still ended.
func TestSignInJustAfterTheOperatorsSignOutWorks(t *testing.T) {
	g := startGateway(t, "")
	// From the start of a second, so that the sign-out and the sign-in
	// after it fall in one.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 5*time.Millisecond)))
	before, after, again := g.browser(), g.browser(), g.browser()
	before.signIn("acme")
	logout := func() {
		if resp := g.admin("POST", "/admin/v1/accounts/acme/console-logout"); resp.StatusCode != 200 {
			t.Fatalf("console-logout: %d %s", resp.StatusCode, readAll(t, resp))
		}
	}
	logout()
	after.signIn("acme")
	if status, page := after.get("/console"); status != 200 || !strings.Contains(page, `id="balance"`) {
		t.Fatalf("the session begun after the sign-out, in its second: %d %.300s", status, page)
	}
	if status, page := before.get("/console"); status != 401 || !strings.Contains(page, "Signed out") {
		t.Fatalf("the session begun before the sign-out, in its second: %d %.300s", status, page)
	}
	// A sign-out right after a sign-in ends it, whatever second the
	// sign-out before them fell in: a session dated a second ahead
	// outlived it.
	logout()
	again.signIn("acme")
	logout()
	for name, b := range map[string]*browser{"after": after, "again": again} {
		if status, page := b.get("/console"); status != 401 || !strings.Contains(page, "Signed out") {
			t.Fatalf("the session %s signed out again at once: %d %.300s", name, status, page)
		}
	}
}

// A browser writes Origin in lower case and without the default port,
// however server.public_url spells them.
func TestPublicURLOriginIsComparedAsBrowsersWriteIt(t *testing.T) {
	g := startGatewayWith(t, "", "  public_url: https://Console.Example.com:443\n")
	b := g.browser()
	resp := b.post("/console/login", url.Values{"token": {tokenOf(t, g.loginURL("acme"))}}, "Origin", "https://console.example.com")
	if body := readAll(t, resp); resp.StatusCode != 303 {
		t.Fatalf("sign-in from the public origin: %d %s", resp.StatusCode, body)
	}
}

// An account past the grace allowance is told its calls are refused now;
// the page spoke of it as something that may happen later.
func TestOverviewSaysCallsAreRefusedPastTheGrace(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("other") // 1 USD
	debit := func(usd int64) {
		if _, err := g.svc.Debit(t.Context(), "other", money.Nanos(usd)*money.NanosPerUSD/10); err != nil {
			t.Fatal(err)
		}
	}
	debit(12) // -0.20: within the grace of 0.50
	if _, page := b.get("/console"); !strings.Contains(page, "below zero") || strings.Contains(page, `id="refused"`) {
		t.Fatalf("overview at -0.20: %s", page)
	}
	debit(5) // -0.70
	if _, page := b.get("/console"); !strings.Contains(page, `id="refused"`) || !strings.Contains(page, "grace allowance of 0.50 USD") {
		t.Fatalf("overview at -0.70: %s", page)
	}
}

// console-login and console-logout take no fields, and decode their body
// as every other admin route does: "garbage" logged out with a 200 and
// {"x":1} issued a link, where the other routes refuse both.
func TestConsoleAdminRoutesRefuseABodyTheyWouldIgnore(t *testing.T) {
	g := startGateway(t, "")
	post := func(path, body string) (int, string) {
		req, err := http.NewRequest("POST", g.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(readAll(t, resp))
	}
	for _, route := range []string{"console-login", "console-logout"} {
		path := "/admin/v1/accounts/acme/" + route
		for _, body := range []string{"garbage", `{"x":1}`, `{"account":"other"}`, `[]`, `{} {}`} {
			if status, out := post(path, body); status != 400 || !strings.Contains(out, `"invalid_request_error"`) {
				t.Errorf("%s with %s: %d %s, want 400", route, body, status, out)
			}
		}
		// No body, as the CLI sends, and an empty object are fine.
		for _, body := range []string{"", "{}"} {
			if status, out := post(path, body); status >= 300 {
				t.Errorf("%s with %q: %d %s", route, body, status, out)
			}
		}
	}
}

// The console's routes answered HEAD with a 405 (the gateway's own routes
// take HEAD as GET), and a path with no page was a 405 for PUT or PATCH
// (Allow: GET, POST) where GET and POST answer it with a 404.
func TestConsoleHeadAndUnknownPathsForEveryMethod(t *testing.T) {
	g := startGateway(t, "")
	do := func(method, path string) *http.Response {
		req, _ := http.NewRequest(method, g.url+path, nil)
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		return resp
	}
	for path, want := range map[string]int{"/console": 401, "/console/style.css": 200, "/console/login": 200, "/console/nope": 404, "/console/": 308} {
		get, head := do("GET", path), do("HEAD", path)
		if head.StatusCode != get.StatusCode || head.StatusCode != want || head.Header.Get("Content-Type") != get.Header.Get("Content-Type") {
			t.Errorf("HEAD %s: %d %q, GET: %d %q, want both %d", path, head.StatusCode, head.Header.Get("Content-Type"),
				get.StatusCode, get.Header.Get("Content-Type"), want)
		}
	}
	for _, method := range []string{"PUT", "PATCH", "DELETE", "OPTIONS", "GET", "POST"} {
		resp := do(method, "/console/nope")
		if resp.StatusCode != 404 || resp.Header.Get("Allow") != "" {
			t.Errorf("%s /console/nope: %d, Allow %q; want 404", method, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

// The holder sees the limits the operator set on the account, and cannot
// make a key with limits of its own: a form posted with rpm=5&tpm=100
// made a key without any (rpm 0, tpm 0: unlimited), saying nothing.
func TestAccountLimitsShownAndKeyFormLimitsRefused(t *testing.T) {
	g := startGateway(t, "clickhouse://127.0.0.1:1/default") // nothing listens there
	if _, err := g.svc.SetLimits(t.Context(), "acme", func(l *accounts.Limits) { *l = accounts.Limits{RPM: 60, MaxConcurrent: 4} }); err != nil {
		t.Fatal(err)
	}
	b := g.browser()
	b.signIn("acme")
	_, page := b.get("/console")
	for _, want := range []string{`id="limit-rpm">60<`, `id="limit-tpm">no limit<`, `id="limit-concurrent">4<`} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q:\n%s", want, page)
		}
	}
	_, page = b.get("/console/keys")
	if !strings.Contains(page, `id="key-limits-note"`) {
		t.Errorf("the key form does not say its keys have no limits of their own:\n%s", page)
	}
	resp := b.post("/console/keys", url.Values{"csrf": {b.csrf()}, "name": {"ci"}, "scopes": {"generate"}, "rpm": {"5"}, "tpm": {"100"}})
	page = string(readAll(t, resp))
	if resp.StatusCode != 400 || !strings.Contains(page, "no rate limits of their own") {
		t.Fatalf("a key form with rpm and tpm: %d %s", resp.StatusCode, page)
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil || len(keys) != 0 {
		t.Fatalf("keys after the refused form: %v %v", keys, err)
	}
}

// Fields the key form does not have were ignored, but rpm and tpm:
// RPM=5, max_concurrent=1, expires_in=1h and ?rpm=5 in the query string
// made a key without them, saying nothing (found by a re-test session).
func TestKeyFormRefusesFieldsItDoesNotHave(t *testing.T) {
	g := startGateway(t, "clickhouse://127.0.0.1:1/default") // nothing listens there
	b := g.browser()
	b.signIn("acme")
	for _, c := range []struct{ field, query string }{
		{"RPM", ""}, {"max_concurrent", ""}, {"expires_in", ""}, {"bogus", ""}, {"", "rpm"}, {"", "bogus"},
	} {
		form := url.Values{"csrf": {b.csrf()}, "name": {"ci"}, "scopes": {"generate"}}
		path, named := "/console/keys", c.field
		if c.field != "" {
			form.Set(c.field, "1")
		} else {
			path, named = path+"?"+c.query+"=5", c.query
		}
		resp := b.post(path, form)
		page := string(readAll(t, resp))
		if resp.StatusCode != 400 || !strings.Contains(page, "&#34;"+named+"&#34;") {
			t.Errorf("%s with %s: %d %s", path, form.Encode(), resp.StatusCode, page)
		}
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil || len(keys) != 0 {
		t.Fatalf("keys after the refused forms: %v %v", keys, err)
	}
}

// The console hid limits that hold: the Overview said "no limit" for
// requests per minute while plugin calls were answered with
// X-Ratelimit-Limit-Requests: 600 (plugins.key_limits, per key), and a
// key made with "keys create -rpm 2 -tpm 100" showed no limits in the
// list. The list shows each key's own limits, and the Overview the
// per-key limits of plugin calls, as gateway.yaml sets them.
func TestConsoleShowsTheLimitsThatHold(t *testing.T) {
	g := startGatewayWithSections(t, "", "", `
plugins:
  key_limits:
    requests_per_minute: 120
    tokens_per_minute: 50000
    concurrent: -1
`)
	ctx := t.Context()
	limited, _, err := g.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "limited", RPM: 2, TPM: 1000})
	if err != nil {
		t.Fatal(err)
	}
	rpmOnly, _, err := g.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "rpm-only", RPM: 5})
	if err != nil {
		t.Fatal(err)
	}
	plain, _, err := g.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	b := g.browser()
	b.signIn("acme")
	_, page := b.get("/console/keys")
	for id, want := range map[string]string{
		limited.KeyID: "2 requests and 1,000 tokens a minute",
		rpmOnly.KeyID: "5 requests a minute",
		plain.KeyID:   "none of its own",
	} {
		row := between(page, `id="key-`+id+`"`, "</tr>")
		if !strings.Contains(row, `<td class="limits">`+want+`</td>`) {
			t.Errorf("key %s lists limits other than %q:\n%s", id, want, row)
		}
	}
	if !strings.Contains(page, "plugin calls") {
		t.Errorf("the keys page does not say plugin calls have limits per key:\n%s", page)
	}
	_, page = b.get("/console")
	for _, want := range []string{`id="limit-rpm">no limit<`, `id="key-limit-rpm">120<`, `id="key-limit-tpm">50,000<`, `id="key-limit-concurrent">no limit<`} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q:\n%s", want, page)
		}
	}
}

// A logging key with retention 0 was listed "on, kept until deleted",
// and the form said 0 keeps logged calls "until they are deleted": a
// holder read that deleting the key deletes them. It does not (they stay,
// to 2105-12-31), and the holder cannot delete them.
func TestRetentionZeroSaysLogsOutliveTheKey(t *testing.T) {
	g := startGateway(t, "")
	key, _, err := g.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "logged", Logging: accounts.Logging{Enabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	b := g.browser()
	b.signIn("acme")
	_, page := b.get("/console/keys")
	if row := between(page, `id="key-`+key.KeyID+`"`, "</tr>"); !strings.Contains(row, "<td>on, kept with no expiry</td>") {
		t.Errorf("a key logging with retention 0 is listed as:\n%s", row)
	}
	day, _, err := g.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "a day", Logging: accounts.Logging{Enabled: true, RetentionDays: 1}})
	if err != nil {
		t.Fatal(err)
	}
	_, page = b.get("/console/keys")
	if row := between(page, `id="key-`+day.KeyID+`"`, "</tr>"); !strings.Contains(row, "<td>on, kept 1 day</td>") {
		t.Errorf("a key logging for one day is listed as:\n%s", row)
	}
	help := between(page, `id="retention-help"`, "</p>")
	if strings.Contains(page, "until deleted") || strings.Contains(page, "until they are deleted") ||
		!strings.Contains(help, "Deleting a key does not delete its logged calls") {
		t.Errorf("the keys page lets deleting a key read as deleting its logs; retention help:\n%s", help)
	}
	resp := b.post("/console/keys", url.Values{"csrf": {b.csrf()}, "name": {"ci"}, "scopes": {"generate"}, "logging": {"on"}, "retention_days": {"x"}})
	if page := string(readAll(t, resp)); resp.StatusCode != 400 || !strings.Contains(page, "0 keeps logged calls with no expiry") {
		t.Errorf("retention x: %d %s", resp.StatusCode, page)
	}
}

// The keys page is read from the gateway's copy of the keys, so that it
// stays up while NATS replaces a lost leader; the page a deletion
// redirects to, sent by a load balancer to another gateway, still shows
// the key deleted: it waits for the watch to bring the revocation.
func TestKeysPageOnAnotherGatewayShowsAKeyDeletedAMomentAgo(t *testing.T) {
	first := startGateway(t, "")
	second := startSecondGateway(t, first)
	b := second.browser()
	b.signIn("acme")
	for round := range 10 {
		info, _, err := first.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: fmt.Sprint("key ", round)})
		if err != nil {
			t.Fatal(err)
		}
		testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if _, ok := second.svc.KeyInfo(info.KeyID); !ok {
				return errors.New("the second gateway has not seen the key")
			}
			return nil
		})
		if _, err := first.svc.RevokeKey(t.Context(), info.KeyID); err != nil {
			t.Fatal(err)
		}
		status, page := b.get("/console/keys?deleted=" + info.KeyID)
		if status != 200 || !strings.Contains(page, ") is deleted: calls with it are refused.") {
			t.Fatalf("round %d: the keys page of the other gateway, right after the deletion: %d %s", round, status, page)
		}
	}
}

// GET /console/keys/revoke without key_id said "Your account has no key
// ." (404), and a key form with name=ok&name=second made a key "ok",
// saying nothing, where every field the form does not have is refused by
// name. Both are 400s that say what is wrong.
func TestKeyFormsRefuseAMissingKeyAndARepeatedField(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	if status, page := b.get("/console/keys/revoke"); status != 400 || !strings.Contains(page, "No key was named") {
		t.Errorf("confirm page without key_id: %d %s", status, page)
	}
	resp := b.post("/console/keys/revoke", url.Values{"csrf": {b.csrf()}})
	if page := string(readAll(t, resp)); resp.StatusCode != 400 || !strings.Contains(page, "No key was named") {
		t.Errorf("revoke without key_id: %d %s", resp.StatusCode, page)
	}
	for _, field := range []struct{ name, first, second string }{
		{"name", "ok", "second"}, {"logging", "on", "off"}, {"retention_days", "1", "2"},
	} {
		form := url.Values{"csrf": {b.csrf()}, "name": {"ci"}, "scopes": {"generate"}, "logging": {"on"}}
		form[field.name] = []string{field.first, field.second}
		resp := b.post("/console/keys", form)
		page := string(readAll(t, resp))
		if resp.StatusCode != 400 || !strings.Contains(page, "&#34;"+field.name+"&#34; was sent 2 times") {
			t.Errorf("%s: %d %s", form.Encode(), resp.StatusCode, page)
		}
	}
	// The delete form too: key_id=A&key_id=B deleted A and said nothing
	// of B, and a field it does not have was taken silently.
	_, first := b.createKey(b.keyForm(url.Values{"name": {"first"}, "scopes": {"generate"}}))
	_, second := b.createKey(b.keyForm(url.Values{"name": {"second"}, "scopes": {"generate"}}))
	for _, tc := range []struct {
		form  url.Values
		path  string
		named string
	}{
		{url.Values{"key_id": {first.ID, second.ID}}, "", "&#34;key_id&#34; was sent 2 times"},
		{url.Values{"key_id": {first.ID}, "confirm": {"yes"}}, "", "&#34;confirm&#34;"},
		{url.Values{"key_id": {first.ID}}, "?key_id=" + second.ID, "&#34;key_id&#34;"},
	} {
		tc.form.Set("csrf", b.csrf())
		resp := b.post("/console/keys/revoke"+tc.path, tc.form)
		if page := string(readAll(t, resp)); resp.StatusCode != 400 || !strings.Contains(page, tc.named) || !strings.Contains(page, "No key was deleted") && !strings.Contains(page, "no key was deleted") {
			t.Errorf("revoke %s%s: %d %s", tc.form.Encode(), tc.path, resp.StatusCode, page)
		}
	}
	for _, key := range []*accounts.Key{first, second} {
		if info, ok := g.svc.KeyInfo(key.ID); !ok || info.RevokedAt != nil {
			t.Errorf("%s after the refused deletions: %+v, %v; want it not deleted", key.ID, info, ok)
		}
		if _, err := g.svc.RevokeKey(t.Context(), key.ID); err != nil {
			t.Fatal(err)
		}
	}

	// Scopes and models are lists: several are the form's own.
	form := b.keyForm(url.Values{"name": {"ci"}, "scopes": {"generate", "classify"}, "models": {"small", "large"}})
	if resp := b.post("/console/keys", form); resp.StatusCode != 200 {
		t.Errorf("a key with two scopes and two models: %d %s", resp.StatusCode, readAll(t, resp))
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	keys = slices.DeleteFunc(keys, func(k accounts.KeyInfo) bool { return k.RevokedAt != nil })
	if err != nil || len(keys) != 1 || keys[0].Name != "ci" {
		t.Fatalf("keys after the forms: %+v %v", keys, err)
	}
}

// A reload of the "Key created" page sent its form again, and each reload
// made another key, shown once on a page the holder had already left; a
// double click made two. The form carries a one-time token, noted on every
// gateway: sent again, on this gateway or another, at once or together,
// it makes no key, and the page names the key it made without its secret.
// A form without the token makes none either.
func TestReloadingTheKeyCreatedPageMakesNoSecondKey(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	form := b.keyForm(url.Values{"name": {"ci"}, "scopes": {"generate"}})
	token, key := b.createKey(form)

	second := &browser{t: t, g: startSecondGateway(t, g), client: b.client}
	for _, via := range []*browser{b, second} {
		resp := via.post("/console/keys", form)
		page := string(readAll(t, resp))
		if resp.StatusCode != 409 || !strings.Contains(page, "Key already created") || !strings.Contains(page, "<code>"+key.ID+"</code>") ||
			!strings.Contains(page, `href="/console/keys/revoke?key_id=`+key.ID+`"`) {
			t.Errorf("the form sent again through %s: %d %s", via.g.url, resp.StatusCode, page)
		}
		if strings.Contains(page, token) || strings.Contains(page, `id="new-key"`) {
			t.Errorf("the form sent again shows the key's secret again: %s", page)
		}
	}
	// Deleted since, the key is not to be deleted again: the page said to.
	if _, err := g.svc.RevokeKey(t.Context(), key.ID); err != nil {
		t.Fatal(err)
	}
	resp := b.post("/console/keys", form)
	page := string(readAll(t, resp))
	if resp.StatusCode != 409 || !strings.Contains(page, "has been deleted since") || strings.Contains(page, "delete it") || strings.Contains(page, "/console/keys/revoke") {
		t.Errorf("the form of a deleted key sent again: %d %s; want it said deleted, with no advice to delete it", resp.StatusCode, page)
	}

	// A double click: the same form sent several times at once.
	clicked := b.keyForm(url.Values{"name": {"clicked"}, "scopes": {"generate"}})
	statuses := make([]int, 6)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", g.url+"/console/keys", strings.NewReader(clicked.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.AddCookie(b.cookie())
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	if made := strings.Count(fmt.Sprint(statuses), "200"); made != 1 || strings.Count(fmt.Sprint(statuses), "409") != len(statuses)-1 {
		t.Errorf("one form sent %d times at once answered %v, want one 200 and 409s", len(statuses), statuses)
	}

	noToken := b.keyForm(url.Values{"name": {"untokened"}, "scopes": {"generate"}})
	noToken.Del("form_token")
	resp = b.post("/console/keys", noToken)
	if page := string(readAll(t, resp)); resp.StatusCode != 400 || !strings.Contains(page, "without the one-time token") || !strings.Contains(page, `value="untokened"`) {
		t.Errorf("a form without its token: %d %s", resp.StatusCode, page)
	}

	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range keys {
		names = append(names, k.Name)
	}
	if slices.Sort(names); strings.Join(names, ",") != "ci,clicked" {
		t.Fatalf("keys %v, want one ci and one clicked", names)
	}
	if logs := g.log.String(); strings.Contains(logs, token) {
		t.Fatalf("the key reached the log:\n%s", logs)
	}
}

// A key form's one-time token was noted for every account at once: a
// token acme had used, sent in other's form, was a 409 "Key already
// created" and no key was made. A malformed token was said to be missing.
func TestKeyFormTokenIsTheAccountsOwn(t *testing.T) {
	g := startGateway(t, "")
	acme, other := g.browser(), g.browser()
	acme.signIn("acme")
	other.signIn("other")
	used := acme.keyForm(url.Values{"name": {"ci"}, "scopes": {"generate"}})
	acme.createKey(used)

	form := other.keyForm(url.Values{"name": {"ci"}, "scopes": {"generate"}})
	form.Set("form_token", used.Get("form_token"))
	_, key := other.createKey(form)
	if key.Account != "other" {
		t.Fatalf("other's form made a key of %s", key.Account)
	}
	if resp := other.post("/console/keys", form); resp.StatusCode != 409 {
		t.Fatalf("other's form sent again: %d; want 409", resp.StatusCode)
	}

	form = other.keyForm(url.Values{"name": {"malformed"}, "scopes": {"generate"}})
	form.Set("form_token", "x")
	resp := other.post("/console/keys", form)
	if page := string(readAll(t, resp)); resp.StatusCode != 400 || !strings.Contains(page, "arrived malformed") || strings.Contains(page, "without the one-time token") {
		t.Errorf("a form with a malformed token: %d %s", resp.StatusCode, page)
	}
	for account, want := range map[string]int{"acme": 1, "other": 1} {
		if keys, err := g.svc.ListKeys(t.Context(), account); err != nil || len(keys) != want {
			t.Errorf("%s has %d keys, %v; want %d", account, len(keys), err, want)
		}
	}
}

// Error pages (a mistyped path, a key that is not there, a form refused,
// an ended session) had no way back but the address bar: no navigation
// and no link. They are console pages like the others: signed in, with
// the navigation and a link back to the overview or to API keys; signed
// out, with a link to how to sign in.
func TestErrorPagesLeadBackIntoTheConsole(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	const nav = `<nav aria-label="Console">`
	signedIn := []struct {
		name, path, back string
		status           int
		post             url.Values
	}{
		{"no such page", "/console/nope", "/console", 404, nil},
		{"no such key", "/console/keys/revoke?key_id=key_nope", "/console/keys", 404, nil},
		{"no key named", "/console/keys/revoke", "/console/keys", 400, nil},
		{"a method the page does not take", "/console/logout", "/console", 405, nil},
		{"a form without its security token", "/console/keys", "/console/keys", 403, url.Values{"name": {"x"}}},
	}
	for _, tc := range signedIn {
		status, page := 0, ""
		if tc.post != nil {
			resp := b.post(tc.path, tc.post)
			status, page = resp.StatusCode, string(readAll(t, resp))
		} else {
			status, page = b.get(tc.path)
		}
		if status != tc.status || !strings.Contains(page, nav) || !strings.Contains(page, `id="account">acme<`) ||
			!strings.Contains(page, `action="/console/logout"`) || !strings.Contains(page, `<a href="`+tc.back+`" id="back">`) {
			t.Errorf("%s, signed in: %d, want %d with the navigation and a link to %s:\n%s", tc.name, status, tc.status, tc.back, page)
		}
	}

	expired := g.console.sessions
	expired.now = func() time.Time { return time.Now().Add(-DefaultSessionTTL - time.Second) }
	expiredCookie, _, err := expired.issue("acme", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	getWith := func(path, cookie string) (int, string) {
		req, _ := http.NewRequest("GET", g.url+path, nil)
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: cookieName, Value: cookie})
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(readAll(t, resp))
	}
	for _, tc := range []struct {
		name, path, cookie string
		status             int
	}{
		{"no such page", "/console/nope", "", 404},
		{"not signed in", "/console/keys", "", 401},
		{"session expired", "/console", expiredCookie, 401},
		{"a sign-in link not valid", "/console/login?token=tgl-nope", "", 401},
	} {
		status, page := getWith(tc.path, tc.cookie)
		if status != tc.status || strings.Contains(page, nav) || !strings.Contains(page, `<a href="/console/login" id="back">How to sign in</a>`) {
			t.Errorf("%s, signed out: %d, want %d with a link to how to sign in:\n%s", tc.name, status, tc.status, page)
		}
	}
	// How to sign in is that page itself: it links to nowhere else.
	if status, page := getWith("/console/login", ""); status != 200 || strings.Contains(page, `id="back"`) {
		t.Errorf("the sign-in page links to itself: %d %s", status, page)
	}
	resp := b.post("/console/logout", url.Values{"csrf": {b.csrf()}})
	if page := string(readAll(t, resp)); resp.StatusCode != 200 || strings.Contains(page, nav) || !strings.Contains(page, `href="/console/login" id="back"`) {
		t.Errorf("signed out: %d %s", resp.StatusCode, page)
	}
}

// A key's name was shown as it is, in the line of text around it: a
// right-to-left override in it (a key made before names were checked for
// them) reversed what follows it, as in
// the flash "Key “x\u202egpj.exe” (key_…) is deleted", and right-to-left
// letters reorder the neutral characters beside them. Every name, account
// and piece of the address a page shows is isolated in a <bdi> (a form
// field in dir="auto"), and HTML-escaped.
func TestNamesAreIsolatedAndEscapedWhereverShown(t *testing.T) {
	g := startGateway(t, "")
	const override = "x\u202egpj.exe"
	overridden, _, err := g.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: override})
	if err != nil {
		t.Fatal(err)
	}
	b := g.browser()
	b.signIn("acme")
	_, page := b.get("/console/keys")
	checkIsolated(t, "the key list", page, override, 2) // the row and the Delete link's label
	checkIsolated(t, "the key list", page, "acme", 2)   // the header and the table's caption
	_, page = b.get("/console/keys/revoke?key_id=" + overridden.KeyID)
	checkIsolated(t, "the delete page", page, override, 1)
	readAll(t, b.post("/console/keys/revoke", url.Values{"csrf": {b.csrf()}, "key_id": {overridden.KeyID}}))
	_, page = b.get("/console/keys?deleted=" + overridden.KeyID)
	checkIsolated(t, "the page saying it is deleted", page, override, 2)

	const markup = `<b>bold</b> & "quoted" 'single' ` + "\u05de\u05e4\u05ea\u05d7 2" // Hebrew letters
	form := b.keyForm(url.Values{"name": {markup}, "scopes": {"generate"}})
	resp := b.post("/console/keys", form)
	page = string(readAll(t, resp))
	if resp.StatusCode != 200 {
		t.Fatalf("create: %d %s", resp.StatusCode, page)
	}
	checkIsolated(t, "the key created page", page, markup, 1)
	resp = b.post("/console/keys", form)
	checkIsolated(t, "the page of a form sent again", string(readAll(t, resp)), markup, 1)
	// A name refused comes back in its field, whose direction is its own.
	resp = b.post("/console/keys", b.keyForm(url.Values{"name": {override}, "scopes": {"generate"}}))
	checkIsolated(t, "the form refused", string(readAll(t, resp)), override, 2) // and the deleted key's row

	// What the address says is shown isolated too: a link can carry an
	// override into a page.
	_, page = b.get("/console/keys/revoke?key_id=" + url.QueryEscape("key_"+override))
	checkIsolated(t, "a key id from the address", page, "key_"+override, 1)
	_, page = b.get("/console/" + url.PathEscape(override))
	checkIsolated(t, "a path from the address", page, "/console/"+override, 1)
	_, page = b.get(strings.TrimPrefix(g.loginURL("acme"), g.url))
	checkIsolated(t, "the sign-in page", page, "acme", 2)
}

// checkIsolated fails unless user is shown on page want times, each as the
// whole text of a <bdi> or of an element with dir="auto", or as the value
// of a field with dir="auto". Shown unescaped, markup in it would parse
// as elements and not be found whole.
func checkIsolated(t *testing.T, where, page, user string, want int) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	isolating := func(n *html.Node) bool {
		if n == nil || n.Type != html.ElementNode {
			return false
		}
		if n.Data == "bdi" {
			return true
		}
		for _, a := range n.Attr {
			if a.Key == "dir" && a.Val == "auto" {
				return true
			}
		}
		return false
	}
	shown := 0
	for n := range doc.Descendants() {
		switch n.Type {
		case html.TextNode:
			if !strings.Contains(n.Data, user) {
				continue
			}
			shown++
			if n.Data != user || !isolating(n.Parent) {
				t.Errorf("%s shows %q not isolated, in <%s>%q", where, user, n.Parent.Data, n.Data)
			}
		case html.ElementNode:
			for _, a := range n.Attr {
				if strings.Contains(a.Val, user) && (a.Key == "value" || a.Key == "title" || a.Key == "aria-label") {
					shown++
					if !isolating(n) {
						t.Errorf("%s shows %q in the %s of a <%s> without dir=\"auto\"", where, user, a.Key, n.Data)
					}
				}
			}
		}
	}
	if shown != want {
		t.Errorf("%s shows %q %d times, want %d:\n%s", where, user, shown, want, page)
	}
}

// The console sent no Strict-Transport-Security, so a browser that had
// used it over https followed a plain http:// link to it (typed, an old
// bookmark) in the clear, sign-in token included, to whoever answered.
// Served over https (an https server.public_url) every console answer
// carries it, with server.hsts_max_age (a year; 0s sends none); over
// http, where a browser ignores it, none is sent.
func TestStrictTransportSecurityOverHTTPSOnly(t *testing.T) {
	paths := []struct{ method, path string }{
		{"GET", "/console/login"}, {"GET", "/console"}, {"GET", "/console/nope"}, {"PUT", "/console/keys"},
		{"GET", "/console/style.css"}, {"GET", "/console/"},
	}
	for _, tc := range []struct{ name, serverLines, want string }{
		{"https public_url", "  public_url: https://console.example.com\n", "max-age=31536000"},
		{"https public_url, an hour", "  public_url: https://console.example.com\n  hsts_max_age: 1h\n", "max-age=3600"},
		{"https public_url, 0s", "  public_url: https://console.example.com\n  hsts_max_age: 0s\n", ""},
		{"http public_url", "  public_url: http://console.example.com\n", ""},
		{"no public_url", "", ""},
	} {
		g := startGatewayWith(t, "", tc.serverLines)
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		for _, p := range paths {
			req, _ := http.NewRequest(p.method, g.url+p.path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			if got := resp.Header.Values("Strict-Transport-Security"); strings.Join(got, "|") != tc.want {
				t.Errorf("%s: %s %s (%d) sends Strict-Transport-Security %q, want %q", tc.name, p.method, p.path, resp.StatusCode, got, tc.want)
			}
		}
	}
}

// A body over the console's 64 KiB is refused by the server before the
// console sees it, and that 413 lacked the headers every console answer
// carries: Strict-Transport-Security, the CSP, X-Frame-Options, nosniff.
func TestConsoleRefusalOfALargeBodyCarriesItsHeaders(t *testing.T) {
	g := startGatewayWith(t, "", "  public_url: https://console.example.com\n")
	body := strings.Repeat("x", maxFormBody+1)
	for name, send := range map[string]io.Reader{
		"Content-Length": strings.NewReader(body),
		"chunked":        struct{ io.Reader }{strings.NewReader(body)}, // its length unknown to the client
	} {
		req, _ := http.NewRequest("POST", g.url+"/console/keys", send)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode != 413 {
			t.Errorf("%s: %d, want 413", name, resp.StatusCode)
		}
		for header, want := range map[string]string{
			"Strict-Transport-Security": "max-age=31536000",
			"Content-Security-Policy":   contentSecurityPolicy,
			"X-Frame-Options":           "DENY",
			"X-Content-Type-Options":    "nosniff",
		} {
			if got := resp.Header.Get(header); got != want {
				t.Errorf("%s: the 413's %s is %q, want %q", name, header, got, want)
			}
		}
	}
}

// A key form whose claim was left naming no key (its send timed out while
// NATS was away and the claim landed when it came back, or the gateway
// was killed between claim and key) makes the key when sent again, at
// once, as its 503 page says to. It was answered "Key already created",
// saying a key had been made when none was, until 20 s had passed.
func TestKeyFormClaimedByASendThatMadeNoKeyMakesTheKey(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	form := b.keyForm(url.Values{"name": {"late"}, "scopes": {"generate"}})
	if _, err := g.console.keyForms.claim(t.Context(), form.Get("form_token"), "acme"); err != nil {
		t.Fatal(err)
	}
	resp := b.post("/console/keys", form)
	if page := string(readAll(t, resp)); resp.StatusCode != 200 || !strings.Contains(page, `id="new-key"`) {
		t.Fatalf("sent again after a claim that made no key: %d %s; want the key made", resp.StatusCode, page)
	}
	if resp := b.post("/console/keys", form); resp.StatusCode != 409 {
		t.Fatalf("sent once more: %d; want 409, the key made", resp.StatusCode)
	}
	if keys, err := g.svc.ListKeys(t.Context(), "acme"); err != nil || len(keys) != 1 {
		t.Fatalf("%d keys, %v; want the 1 made", len(keys), err)
	}
}

// A key form whose key was made and shown, but whose note of the key was
// lost (NATS failing after the key was stored), made a second key when
// sent again 20 s later: its claim, naming no key, was taken for one
// whose send had given up. Sent again, on this gateway or another, at
// once or later, it names the key it made, and the note is repaired.
func TestKeyFormWhoseKeyWasNotNotedMakesNoSecondKey(t *testing.T) {
	g := startGateway(t, "")
	b := g.browser()
	b.signIn("acme")
	form := b.keyForm(url.Values{"name": {"unnoted"}, "scopes": {"generate"}})
	_, key := b.createKey(form)
	// What a lost note leaves: the claim, naming no key.
	token := form.Get("form_token")
	if _, err := g.console.keyForms.kv.Put(t.Context(), keyFormKey("acme", token), []byte(`{"account":"acme"}`)); err != nil {
		t.Fatal(err)
	}
	second := &browser{t: t, g: startSecondGateway(t, g), client: b.client}
	for _, via := range []*browser{second, b} {
		resp := via.post("/console/keys", form)
		page := string(readAll(t, resp))
		if resp.StatusCode != 409 || !strings.Contains(page, "Key already created") || !strings.Contains(page, "<code>"+key.ID+"</code>") {
			t.Errorf("the form sent again through %s: %d %s; want a 409 naming %s", via.g.url, resp.StatusCode, page, key.ID)
		}
	}
	if keys, err := g.svc.ListKeys(t.Context(), "acme"); err != nil || len(keys) != 1 {
		t.Fatalf("%d keys, %v; want the 1 made", len(keys), err)
	}
	entry, err := g.console.keyForms.kv.Get(t.Context(), keyFormKey("acme", token))
	if err != nil || !strings.Contains(string(entry.Value()), key.ID) {
		t.Fatalf("the form's note after it was sent again: %v; want it to name %s", err, key.ID)
	}
}
