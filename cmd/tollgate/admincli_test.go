package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// An admin command whose gateway.yaml does not load says so, instead of
// calling the defaults' 127.0.0.1:8080, which may be another gateway that
// takes the exported token; -url with -token still work without the file.
func TestAdminCommandsRefuseAnInvalidConfig(t *testing.T) {
	calls := 0
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Write([]byte(`{"id":"acme","balance_usd":"1"}`))
	}))
	defer gw.Close()
	bad := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(bad, []byte("billing:\n  grace_usd: \"0.50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOLLGATE_CONFIG", bad)
	t.Setenv("TOLLGATE_LISTEN", strings.TrimPrefix(gw.URL, "http://"))
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tga-x")
	// Without -url the address would be the file's: refused.
	if err := runAccounts([]string{"get", "acme"}); err == nil || !strings.Contains(err.Error(), bad) || calls != 0 {
		t.Fatalf("accounts get with an invalid %s: %v, %d calls made", bad, err, calls)
	}
	if err := runKeys([]string{"list", "acme"}); err == nil || !strings.Contains(err.Error(), bad) || calls != 0 {
		t.Fatalf("keys list with an invalid config: %v, %d calls", err, calls)
	}
	// With -url and a token the file is not needed.
	if err := runAccounts([]string{"get", "acme", "-url", gw.URL}); err != nil || calls != 1 {
		t.Fatalf("with -url and $TOLLGATE_ADMIN_TOKEN: %v, %d calls", err, calls)
	}
	// Without a token, admin.token is in the file's data dir: refused.
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "")
	if err := runAccounts([]string{"get", "acme", "-url", gw.URL}); err == nil || !strings.Contains(err.Error(), bad) || calls != 1 {
		t.Fatalf("with -url, no token and an invalid config: %v, %d calls", err, calls)
	}
	// A TOLLGATE_CONFIG that names no file is a typo, not the defaults.
	t.Setenv("TOLLGATE_CONFIG", bad+".missing")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tga-x")
	if err := runAccounts([]string{"get", "acme"}); err == nil || !strings.Contains(err.Error(), ".missing") || calls != 1 {
		t.Fatalf("with TOLLGATE_CONFIG naming no file: %v, %d calls", err, calls)
	}
}

// The CLI takes admin.token as the gateway does: a file an editor saved
// with a byte order mark gave the gateway one token and the CLI another,
// and every CLI call was a 401.
func TestAdminClientReadsTheTokenFileAsTheGatewayDoes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte("\xef\xbb\xbftga-0123456789abcdef\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{}
	cfg.Server.DataDir = dir
	served, err := loadAdminToken(cfg, false, new(string))
	if err != nil {
		t.Fatal(err)
	}
	c, err := newAdminClient("http://127.0.0.1:1", "", cfg)
	if err != nil || c.token != served {
		t.Fatalf("the CLI took %q (%v), the gateway %q", c.token, err, served)
	}
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte("\xe2\x80\x8b"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newAdminClient("http://127.0.0.1:1", "", cfg); err == nil {
		t.Fatal("the CLI took a token file of a zero-width space")
	}
}

// fakeGateway answers every admin call with an account and records the
// method, the path as sent (with its query, if any) and the body of each.
func fakeGateway(t *testing.T) (url string, calls *[]string) {
	t.Helper()
	calls = new([]string)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		path := r.URL.EscapedPath()
		if r.URL.RawQuery != "" {
			path += "?" + r.URL.RawQuery
		}
		*calls = append(*calls, r.Method+" "+path+" "+string(body))
		w.Write([]byte(`{"id":"acme","balance_usd":"1"}`))
	}))
	t.Cleanup(gw.Close)
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tga-x")
	return gw.URL, calls
}

// A flag of another subcommand is refused, naming the flags this one
// takes: "accounts create acme5 -idempotency-key x" and "accounts credit
// acme 5 -credit 10" succeeded and dropped the flag.
func TestAdminSubcommandsRefuseFlagsTheyDoNotTake(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runAccounts, []string{"create", "acme5", "-idempotency-key", "x"}, "accounts create does not take -idempotency-key; it takes -credit, -max-concurrent, -rpm, -token, -tpm, -url"},
		{runAccounts, []string{"limits", "acme", "-credit", "10"}, "accounts limits does not take -credit; it takes -max-concurrent, -rpm, -token, -tpm, -url"},
		{runAccounts, []string{"credit", "acme", "5", "-credit", "10"}, "accounts credit does not take -credit; it takes -idempotency-key, -token, -url"},
		{runAccounts, []string{"get", "acme", "-credit=10"}, "accounts get does not take -credit; it takes -token, -url"},
		{runKeys, []string{"list", "acme", "-name", "ci"}, "keys list does not take -name; it takes -token, -url"},
		{runKeys, []string{"revoke", "key_1", "-logging"}, "keys revoke does not take -logging; it takes -token, -url"},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused commands called the gateway: %q", *calls)
	}
	// Where they belong, the flags still go out.
	if err := runAccounts([]string{"credit", "acme", "5", "-idempotency-key", "pay_1", "-url", url}); err != nil {
		t.Fatal(err)
	}
	if err := runAccounts([]string{"create", "acme5", "-credit", "10", "-url", url}); err != nil {
		t.Fatal(err)
	}
	// An account's limits: at creation, and later only those given, so
	// "limits acme -rpm 60" keeps the account's tpm.
	if err := runAccounts([]string{"create", "acme6", "-max-concurrent", "4", "-url", url}); err != nil {
		t.Fatal(err)
	}
	if err := runAccounts([]string{"limits", "acme", "-rpm", "60", "-tpm=0", "-url", url}); err != nil {
		t.Fatal(err)
	}
	want := []string{`POST /admin/v1/accounts/acme/credit {"idempotency_key":"pay_1","usd":"5"}`,
		`POST /admin/v1/accounts {"credit_usd":"10","id":"acme5"}`,
		`POST /admin/v1/accounts {"id":"acme6","max_concurrent":4}`,
		`PATCH /admin/v1/accounts/acme {"rpm":60,"tpm":0}`}
	if strings.Join(*calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls %q, want %q", *calls, want)
	}
}

// An id goes into the admin path as one segment: joined as typed,
// "accounts credit acme/../acme4 1" credited acme4 and "accounts get
// acme?x" got acme. An id that cannot be one segment is refused before
// any call; the rest is escaped.
func TestAdminCLIKeepsIDsInOneSegment(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
	}{
		{runAccounts, []string{"credit", "acme/../acme4", "1"}},
		{runAccounts, []string{"get", "acme/keys"}},
		{runAccounts, []string{"get", ".."}},
		{runAccounts, []string{"login", "acme/../acme4"}},
		{runAccounts, []string{"logout", "."}},
		{runKeys, []string{"list", "acme/.."}},
		{runKeys, []string{"create", "../acme4", "-name", "ci"}},
		{runKeys, []string{"revoke", "key_1/../../accounts/acme"}},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || !strings.Contains(err.Error(), "is not an id: an id holds no '/' and is not empty, '.' or '..'") {
			t.Errorf("%s: %v", strings.Join(tc.args, " "), err)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused ids were sent: %q", *calls)
	}
	for _, tc := range []struct {
		run  func([]string) error
		args []string
	}{
		{runAccounts, []string{"get", "acme?x=1"}},
		{runAccounts, []string{"credit", "acme#1", "1"}},
		{runKeys, []string{"list", "a%2Fb"}},
		{runKeys, []string{"revoke", "key 1"}},
	} {
		if err := tc.run(append(tc.args, "-url", url)); err != nil {
			t.Fatalf("%s: %v", strings.Join(tc.args, " "), err)
		}
	}
	want := []string{"GET /admin/v1/accounts/acme%3Fx=1 ", `POST /admin/v1/accounts/acme%231/credit {"usd":"1"}`,
		"GET /admin/v1/accounts/a%252Fb/keys ", "DELETE /admin/v1/keys/key%201 "}
	if strings.Join(*calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls\n%s\nwant\n%s", strings.Join(*calls, "\n"), strings.Join(want, "\n"))
	}
}

// -url without a scheme says what to write, not url.Parse's "first path
// segment in URL cannot contain colon".
func TestAdminURLWithoutAScheme(t *testing.T) {
	for _, u := range []string{"127.0.0.1:17100", "localhost:17100", "ftp://127.0.0.1:17100", "http://"} {
		_, err := newAdminClient(u, "tga-x", nil)
		if err == nil || !strings.Contains(err.Error(), "write it as http://HOST:PORT") || strings.Contains(err.Error(), "first path segment") {
			t.Errorf("-url %s: %v", u, err)
		}
	}
	if _, err := newAdminClient("127.0.0.1:17100", "tga-x", nil); err == nil || !strings.Contains(err.Error(), "-url http://127.0.0.1:17100") {
		t.Errorf("no scheme: %v, want the URL with http:// to copy", err)
	}
	for _, u := range []string{"http://127.0.0.1:17100", "https://gw.example.com/", "http://[::1]:8080"} {
		if _, err := newAdminClient(u, "tga-x", nil); err != nil {
			t.Errorf("-url %s: %v", u, err)
		}
	}
}

// A subcommand's -h names each default once (it printed "(default from
// gateway.yaml's server.listen) (default "http://…")"), and never shows
// the admin token $TOLLGATE_ADMIN_TOKEN holds.
func TestAdminFlagHelp(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Setenv("TOLLGATE_LISTEN", "127.0.0.1:17100")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tga-secret-value")
	out, err := captureStdout(t, func() error { return runAccounts([]string{"credit", "-h"}) })
	if err != nil || !strings.Contains(out, "-idempotency-key") || !strings.Contains(out, `"http://127.0.0.1:17100"`) {
		t.Fatalf("accounts credit -h: %v\n%s", err, out)
	}
	if strings.Contains(out, "tga-secret-value") {
		t.Fatalf("-h shows the admin token:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Count(line, "default") > 1 {
			t.Errorf("a default named twice: %s", line)
		}
	}
}

// json.Marshal writes invalid UTF-8 as U+FFFD: "keys create demo -name
// $'a\xffb'" made a key the gateway would have refused, named otherwise.
func TestAdminCLIRefusesInvalidUTF8(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runKeys, []string{"create", "demo", "-name", "a\xffb"}, `-name "a\xffb" is not valid UTF-8`},
		{runKeys, []string{"create", "demo", "-name", "ci", "-models", "m\xfe"}, `-models "m\xfe" is not valid UTF-8`},
		{runAccounts, []string{"create", "ac\xffme"}, `"ac\xffme" is not valid UTF-8`},
		{runAccounts, []string{"credit", "acme", "1", "-idempotency-key", "pay\xc3"}, `-idempotency-key "pay\xc3" is not valid UTF-8`},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s", tc.args, err, tc.want)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused commands called the gateway: %q", *calls)
	}
	if err := runKeys([]string{"create", "demo", "-name", "café 😀", "-url", url}); err != nil || len(*calls) != 1 {
		t.Fatalf("a valid UTF-8 name: %v, %q", err, *calls)
	}
}

// The admin path was appended to -url as typed: after a query or a
// fragment it became part of them and the call, admin token and all, went
// to "GET /"; after /admin/v1 the path was /admin/v1/admin/v1, after
// OPENAI_BASE_URL's /v1 /v1/admin/v1 (a 404); and
// "-url //127.0.0.1:11100" was told to write "http:////127.0.0.1:11100".
func TestAdminURLWithAQueryFragmentOrAdminPath(t *testing.T) {
	for u, want := range map[string]string{
		"http://127.0.0.1:11100?x=1":      "without a query or fragment (-url http://127.0.0.1:11100)",
		"http://127.0.0.1:11100?":         "without a query or fragment (-url http://127.0.0.1:11100)",
		"http://127.0.0.1:11100#x":        "without a query or fragment (-url http://127.0.0.1:11100)",
		"http://127.0.0.1:11100/#":        "without a query or fragment (-url http://127.0.0.1:11100/)",
		"http://127.0.0.1:11100/admin/v1": "without /admin/v1, which each command adds (-url http://127.0.0.1:11100)",
		"https://gw.example/tg/admin/v1/": "without /admin/v1, which each command adds (-url https://gw.example/tg)",
		"//127.0.0.1:11100":               "(-url http://127.0.0.1:11100)",
		"http://127.0.0.1:11100/v1":       "without the /v1 of OPENAI_BASE_URL (-url http://127.0.0.1:11100)",
		"https://gw.example/tg/v1/":       "without the /v1 of OPENAI_BASE_URL (-url https://gw.example/tg)",
	} {
		if _, err := newAdminClient(u, "tga-x", nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("-url %s: %v, want %q", u, err, want)
		}
	}
	// A reverse proxy's path prefix is kept, the admin path after it.
	url, calls := fakeGateway(t)
	if err := runAccounts([]string{"get", "acme", "-url", url + "/tg/"}); err != nil {
		t.Fatal(err)
	}
	if want := "GET /tg/admin/v1/accounts/acme "; len(*calls) != 1 || (*calls)[0] != want {
		t.Fatalf("calls %q, want %q", *calls, want)
	}
}

// A flag given twice took the last value without a word ("keys create
// demo -name a -name b" named the key b); finance refuses a parameter
// given twice, and the admin subcommands now refuse a repeated flag.
func TestAdminSubcommandsRefuseARepeatedFlag(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runKeys, []string{"create", "demo", "-name", "a", "-name", "b"}, `-name is given twice ("a" and "b"): give each flag once`},
		{runKeys, []string{"create", "demo", "-name", "a", "-logging", "-logging=false"}, `-logging is given twice ("true" and "false"): give each flag once`},
		{runKeys, []string{"create", "demo", "-rpm", "5", "-name=a", "-rpm=0"}, `-rpm is given twice ("5" and "0")`},
		{runKeys, []string{"list", "acme", "-url", "http://127.0.0.1:1"}, `-url is given twice`},
		{runAccounts, []string{"credit", "acme", "-idempotency-key", "p1", "5", "-idempotency-key", "p2"}, `-idempotency-key is given twice ("p1" and "p2")`},
		{runAccounts, []string{"create", "acme", "-credit", "1", "-credit", "10"}, `-credit is given twice ("1" and "10")`},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s", tc.args, err, tc.want)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused commands called the gateway: %q", *calls)
	}
	if err := runKeys([]string{"create", "demo", "-name", "a", "-logging", "-retention-days", "3", "-url", url}); err != nil || len(*calls) != 1 {
		t.Fatalf("each flag once: %v, %q", err, *calls)
	}
}

// The number flags are read in decimal: read as Go literals, "accounts
// limits acme -rpm 010" set 8, "-rpm 0x10" 16 and "-tpm 0b101" 5, without
// a word. A leading 0 is refused rather than read as decimal, so that a
// script that meant octal says so; a flag given twice is still refused.
func TestAdminNumberFlagsAreDecimal(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runAccounts, []string{"limits", "acme", "-rpm", "010"}, `invalid value "010" for flag -rpm: a leading 0 is not taken (Go reads 010 as octal); write 10`},
		{runAccounts, []string{"limits", "acme", "-rpm", "0x10"}, `invalid value "0x10" for flag -rpm: not a whole number in decimal, such as 60`},
		{runAccounts, []string{"limits", "acme", "-tpm", "0b101"}, `invalid value "0b101" for flag -tpm: not a whole number in decimal`},
		{runAccounts, []string{"limits", "acme", "-tpm", "1_000"}, `invalid value "1_000" for flag -tpm: not a whole number in decimal`},
		{runAccounts, []string{"create", "acme5", "-max-concurrent", "0o7"}, `invalid value "0o7" for flag -max-concurrent: not a whole number in decimal`},
		{runAccounts, []string{"create", "acme5", "-max-concurrent", "99999999999999999999"}, `invalid value "99999999999999999999" for flag -max-concurrent: out of range`},
		{runKeys, []string{"create", "demo", "-name", "a", "-rpm", "0x10"}, `invalid value "0x10" for flag -rpm: not a whole number in decimal`},
		{runKeys, []string{"create", "demo", "-name", "a", "-tpm", "-010"}, `invalid value "-010" for flag -tpm: a leading 0 is not taken (Go reads -010 as octal); write -10`},
		{runKeys, []string{"create", "demo", "-name", "a", "-logging", "-retention-days", "030"}, `for flag -retention-days: a leading 0 is not taken (Go reads 030 as octal); write 30`},
		{runAccounts, []string{"limits", "acme", "-rpm", "10", "-rpm", "010"}, `-rpm is given twice ("10" and "010")`},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s", tc.args, err, tc.want)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused commands called the gateway: %q", *calls)
	}
	if err := runAccounts([]string{"limits", "acme", "-rpm", "10", "-tpm", "0", "-max-concurrent=+3", "-url", url}); err != nil {
		t.Fatal(err)
	}
	if err := runKeys([]string{"create", "demo", "-name", "a", "-rpm", "16", "-logging", "-retention-days", "30", "-url", url}); err != nil {
		t.Fatal(err)
	}
	want := []string{`PATCH /admin/v1/accounts/acme {"max_concurrent":3,"rpm":10,"tpm":0}`,
		`POST /admin/v1/accounts/demo/keys {"logging":{"enabled":true,"retention_days":30},"models":null,"name":"a","rpm":16,"scopes":null,"tpm":0}`}
	if strings.Join(*calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls %q, want %q", *calls, want)
	}
}

// tollgate -h listed "accounts create ID [-credit USD] | get ID | credit
// …", without accounts limits and the limit flags `tollgate accounts`
// names (found by a re-test session): both print one text.
func TestHelpListsTheAccountsCommandsAsAccountsDoes(t *testing.T) {
	err := runAccounts(nil)
	if err == nil {
		t.Fatal("tollgate accounts with no subcommand returned no error")
	}
	for _, want := range []string{"accounts list [-limit N] [-after ID]", "accounts limits ID [-rpm N] [-tpm N] [-max-concurrent N]", "accounts create ID [-credit USD] [-rpm N] [-tpm N] [-max-concurrent N]", "accounts login ID", "accounts logout ID"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("tollgate accounts says %q, lacking %q", err, want)
		}
		if !strings.Contains(usage, want) {
			t.Errorf("tollgate -h lacks %q:\n%s", want, usage)
		}
	}
}

// A 401 says where the refused token came from: a stale
// TOLLGATE_ADMIN_TOKEN from an earlier data_dir won over the config's
// admin.token without a word.
func TestAdminUnauthorizedNamesTheTokensSource(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"error":{"message":"invalid admin token"}}`))
	}))
	defer gw.Close()
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tga-stale-token-of-another-gateway")
	err := runAccounts([]string{"get", "acme", "-url", gw.URL})
	if err == nil || !strings.Contains(err.Error(), "the refused admin token came from $TOLLGATE_ADMIN_TOKEN") {
		t.Errorf("with TOLLGATE_ADMIN_TOKEN: %v", err)
	}
	err = runAccounts([]string{"get", "acme", "-url", gw.URL, "-token", "tga-given-with-the-flag"})
	if err == nil || !strings.Contains(err.Error(), "the refused admin token came from -token") {
		t.Errorf("with -token: %v", err)
	}
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "")
	dir := t.TempDir()
	t.Setenv("TOLLGATE_DATA_DIR", dir)
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte("tga-the-token-in-the-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = runAccounts([]string{"get", "acme", "-url", gw.URL})
	if err == nil || !strings.Contains(err.Error(), "the refused admin token came from "+filepath.Join(dir, "admin.token")) {
		t.Errorf("with the data dir's file: %v", err)
	}
}

// TestAdminNoTokenNamesTheFileLookedFor: run beside the gateway's data
// dir, but the gateway was started with TOLLGATE_ADMIN_TOKEN exported
// (server.admin_token), so it wrote no admin.token; "run where the
// gateway's data dir is" sent the user to where they already were.
func TestAdminNoTokenNamesTheFileLookedFor(t *testing.T) {
	dir := t.TempDir()
	cfg := &config.Config{}
	cfg.Server.DataDir = filepath.Join(dir, "data2")
	_, err := newAdminClient("http://127.0.0.1:1", "", cfg)
	if err == nil {
		t.Fatal("no token and no admin.token: a client was made")
	}
	for _, want := range []string{filepath.Join(dir, "data2", "admin.token"), "server.admin_token", "TOLLGATE_ADMIN_TOKEN", "writes none", "-token"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// A flag given but empty ("-idempotency-key $PAYMENT_ID" with the
// variable unset) is refused, not taken as left out: the credit went out
// with no key, and a retry of it credited again.
func TestAdminFlagGivenEmptyIsRefused(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runAccounts, []string{"credit", "acme", "5", "-idempotency-key", ""}, `-idempotency-key is empty: give the payment's id, or leave the flag out`},
		{runAccounts, []string{"credit", "acme", "5", "-idempotency-key="}, `-idempotency-key is empty`},
		// An account with no credit, a key that never expires.
		{runAccounts, []string{"create", "acme", "-credit", ""}, `-credit is empty: give an amount such as 10.00, or leave the flag out`},
		// The first page, where the next was meant.
		{runAccounts, []string{"list", "-after", ""}, `-after is empty: give the last_id of the page before, or leave the flag out`},
		{runKeys, []string{"create", "acme", "-name", "ci", "-expires-in", ""}, `-expires-in is empty: give a lifetime such as 720h, or leave the flag out`},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s", tc.args, err, tc.want)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused commands called the gateway: %q", *calls)
	}
}

// accounts list sends the page flags given, and only those; keys get
// looks a key up by its id. Neither takes another's flags or arguments.
func TestAdminListAccountsAndGetKey(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runAccounts, []string{"list", "-credit", "1"}, "accounts list does not take -credit; it takes -after, -limit, -token, -url"},
		{runAccounts, []string{"list", "-limit", "010"}, "a leading 0 is not taken"},
		{runAccounts, []string{"list", "-limit", "2", "-limit", "3"}, "-limit is given twice"},
		{runAccounts, []string{"list", "acme"}, "usage: tollgate accounts"},
		{runKeys, []string{"get", "key_1", "-name", "ci"}, "keys get does not take -name; it takes -token, -url"},
		{runKeys, []string{"get"}, "usage: tollgate keys"},
		{runKeys, []string{"get", "key_1", "key_2"}, "usage: tollgate keys"},
		{runKeys, []string{"get", "key_1/../../accounts"}, "is not an id"},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused commands called the gateway: %q", *calls)
	}
	for _, args := range [][]string{
		{"list"},
		{"list", "-limit", "2"},
		{"list", "-after", "acme&limit=9", "-limit=1000"},
	} {
		if err := runAccounts(append(args, "-url", url)); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
	}
	if err := runKeys([]string{"get", "key 1", "-url", url}); err != nil {
		t.Fatal(err)
	}
	want := []string{"GET /admin/v1/accounts ", "GET /admin/v1/accounts?limit=2 ",
		"GET /admin/v1/accounts?after=acme%26limit%3D9&limit=1000 ", "GET /admin/v1/keys/key%201 "}
	if strings.Join(*calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls\n%s\nwant\n%s", strings.Join(*calls, "\n"), strings.Join(want, "\n"))
	}
}

// A credit typed wrong is corrected with a negative amount, after the
// account or after "--", with its own idempotency key.
func TestAccountsCreditSendsANegativeCorrection(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, args := range [][]string{
		{"credit", "acme", "-990", "-url", url},
		{"credit", "acme", "-url", url, "-idempotency-key", "fix_1", "--", "-9.99"},
	} {
		if err := runAccounts(args); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
	}
	want := []string{`POST /admin/v1/accounts/acme/credit {"usd":"-990"}`,
		`POST /admin/v1/accounts/acme/credit {"idempotency_key":"fix_1","usd":"-9.99"}`}
	if strings.Join(*calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls %q, want %q", *calls, want)
	}
}

// A negative amount is the amount wherever it stands: after a flag,
// "accounts credit acme -idempotency-key fix1 -6" said "accounts credit
// does not take -6". A flag's value that looks like one stays its value.
func TestAccountsCreditTakesANegativeAmountAfterItsFlags(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, args := range [][]string{
		{"credit", "acme", "-idempotency-key", "fix_1", "-6", "-url", url},
		{"credit", "-url", url, "acme", "-idempotency-key=fix_2", "-0.5"},
		{"credit", "-idempotency-key", "-7", "acme", "-8", "-url", url},
		{"create", "acme", "-credit", "-5", "-url", url},
	} {
		if err := runAccounts(args); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
	}
	want := []string{`POST /admin/v1/accounts/acme/credit {"idempotency_key":"fix_1","usd":"-6"}`,
		`POST /admin/v1/accounts/acme/credit {"idempotency_key":"fix_2","usd":"-0.5"}`,
		`POST /admin/v1/accounts/acme/credit {"idempotency_key":"-7","usd":"-8"}`,
		`POST /admin/v1/accounts {"credit_usd":"-5","id":"acme"}`}
	if strings.Join(*calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls\n%s\nwant\n%s", strings.Join(*calls, "\n"), strings.Join(want, "\n"))
	}
}

// A wrong number of arguments printed the whole usage: it says what is
// missing or unexpected, then the subcommand's own usage line.
func TestAdminArgumentErrorsSayWhatIsWrong(t *testing.T) {
	url, calls := fakeGateway(t)
	for _, tc := range []struct {
		run  func([]string) error
		args []string
		want string
	}{
		{runKeys, []string{"revoke"}, "keys revoke: KEY_ID is missing\nusage: tollgate keys revoke KEY_ID"},
		{runKeys, []string{"revoke", "a", "b"}, `keys revoke: unexpected argument "b" after KEY_ID` + "\nusage: tollgate keys revoke KEY_ID"},
		{runKeys, []string{"create", "-name", "ci"}, "keys create: ACCOUNT is missing\nusage: tollgate keys create ACCOUNT -name NAME [-scopes a,b] [-models m1,m2] [-rpm N] [-tpm N] [-expires-in 720h] [-logging] [-retention-days N]"},
		{runAccounts, []string{"credit", "acme"}, "accounts credit: USD is missing\nusage: tollgate accounts credit ID USD [-idempotency-key KEY]"},
		{runAccounts, []string{"list", "acme"}, `accounts list: unexpected argument "acme" (it takes none)` + "\nusage: tollgate accounts list [-limit N] [-after ID]"},
		{runAccounts, []string{"get"}, "accounts get: ID is missing\nusage: tollgate accounts get ID"},
		// An empty PATCH changed nothing and exited 0.
		{runAccounts, []string{"limits", "acme"}, "accounts limits: give at least one of -rpm, -tpm, -max-concurrent (0 = no limit)\nusage: tollgate accounts limits ID [-rpm N] [-tpm N] [-max-concurrent N]"},
	} {
		err := tc.run(append(tc.args, "-url", url))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to begin %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if len(*calls) != 0 {
		t.Fatalf("refused commands called the gateway: %q", *calls)
	}
}

// A password given in -url was printed with the URL when the gateway
// did not answer ("is tollgate serve running at http://user:s3cret@…").
func TestAdminURLPasswordIsNotPrinted(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tga-x")
	for _, u := range []string{"http://user:s3cret@127.0.0.1:1", "http://user:s3cret@127.0.0.1:1/?x=1", "http://user:s3cret@127.0.0.1:1/v1", "user:s3cret@127.0.0.1:1"} {
		err := runAccounts([]string{"get", "acme", "-url", u})
		if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "user:xxxxx@127.0.0.1:1") {
			t.Errorf("-url %s: %v, want the URL with its password redacted", u, err)
		}
	}
}

// A gateway that does not answer is named once, as RedactURL writes it:
// the message also quoted Go's url.Error, the URL in another redaction,
// "(is `tollgate serve` running at http://u:xxxxx@127.0.0.1:1?): Get
// "http://u:***@127.0.0.1:1/admin/v1/accounts"".
func TestAdminUnreachableGatewayIsNamedOnce(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "tga-x")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	err = runAccounts([]string{"list", "-url", "http://u:pw@" + addr})
	if err == nil || strings.Count(err.Error(), "://") != 1 || !strings.Contains(err.Error(), "running at http://u:xxxxx@"+addr+"?)") ||
		!strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "***") {
		t.Fatalf("accounts list with the gateway down: %v; want its URL named once, as http://u:xxxxx@%s, and why the call failed", err, addr)
	}
}
