package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// adminClient calls the admin API of a running gateway.
type adminClient struct {
	url, token string
	// shown is url as messages print it, its password left out.
	shown string
	// tokenFrom says where token came from, for a 401: a stale
	// $TOLLGATE_ADMIN_TOKEN won over the data dir's admin.token without a
	// word, and the 401 did not say which token was refused.
	tokenFrom string
	http      *http.Client
}

// adminTarget is where an admin command goes: gateway.yaml's server.listen
// and data dir (for admin.token), unless -url and -token say otherwise.
type adminTarget struct {
	url, token *string
	cfg        *config.Config
	// cfgErr: gateway.yaml exists but does not load. Defaults in its place
	// would send the call to 127.0.0.1:8080, another gateway maybe, with
	// an exported token.
	cfgErr error
}

func adminFlags(fs *flag.FlagSet) *adminTarget {
	t := &adminTarget{}
	// The gateway's own listen address (gateway.yaml, where
	// $TOLLGATE_LISTEN fills it in), as its data dir comes from there.
	listen := os.Getenv("TOLLGATE_LISTEN")
	path := configPath(nil)
	switch cfg, err := config.LoadNotConnecting(path); {
	case err == nil:
		t.cfg, listen = cfg, cfg.Server.Listen
	case !errors.Is(err, os.ErrNotExist) || os.Getenv("TOLLGATE_CONFIG") != "":
		// A file named on purpose that is not there is a typo, as it is
		// to tollgate serve; only the implicit ./gateway.yaml may be
		// missing.
		t.cfgErr = fmt.Errorf("loading %s, which says where the gateway and its data dir are (fix it, or pass -url and -token):\n%w", path, err)
	}
	// The flag package adds (default "…") itself: the usage names where
	// the default comes from without a second "default".
	t.url = fs.String("url", "http://"+dialable(cmp.Or(listen, "127.0.0.1:8080")), "gateway base URL, from gateway.yaml's server.listen unless given")
	// The token is read in client, not made the flag's default, which -h
	// would print.
	t.token = fs.String("token", "", "admin token (default $TOLLGATE_ADMIN_TOKEN, else <data_dir>/admin.token)")
	return t
}

// client is the admin client for fs's parsed flags.
func (t *adminTarget) client(fs *flag.FlagSet) (*adminClient, error) {
	urlGiven := false
	fs.Visit(func(f *flag.Flag) { urlGiven = urlGiven || f.Name == "url" })
	token := cmp.Or(*t.token, os.Getenv("TOLLGATE_ADMIN_TOKEN"))
	if t.cfgErr != nil && (!urlGiven || token == "") {
		return nil, t.cfgErr
	}
	c, err := newAdminClient(*t.url, token, t.cfg)
	switch {
	case err != nil:
	case *t.token != "":
		c.tokenFrom = "-token"
	case token != "":
		c.tokenFrom = "$TOLLGATE_ADMIN_TOKEN, which is taken before the data dir's admin.token: unset it if it is another gateway's"
	}
	return c, err
}

// dialable turns a listen address into one to connect to: a gateway
// listening on every address is reached on loopback.
func dialable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// newAdminClient calls url with token, else with the admin.token of cfg's
// data dir (nil: $TOLLGATE_DATA_DIR, else ./data).
func newAdminClient(baseURL, token string, cfg *config.Config) (*adminClient, error) {
	// "-url 127.0.0.1:8080" failed on the first call with url.Parse's
	// "first path segment in URL cannot contain colon".
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		example := ""
		if !strings.Contains(baseURL, "://") {
			example = " (-url http://" + config.RedactURL(strings.TrimPrefix(baseURL, "//")) + ")"
		}
		return nil, fmt.Errorf("gateway URL %q: write it as http://HOST:PORT or https://HOST%s", config.RedactURL(baseURL), example)
	}
	// The admin path is appended to the URL: after a query or a fragment
	// it was part of them, and the call, admin token and all, went to
	// "GET /"; after /admin/v1 it was /admin/v1/admin/v1. A path before
	// it (a reverse proxy's prefix) is kept.
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(baseURL, "#") {
		return nil, fmt.Errorf("gateway URL %q: give it without a query or fragment (-url %s)", config.RedactURL(baseURL), (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String())
	}
	// OPENAI_BASE_URL, which the first start prints, ends in /v1: given
	// as -url it sent the call to /v1/admin/v1/… and got a 404.
	for _, suffix := range [...]struct{ path, what string }{
		{"/admin/v1", "without /admin/v1, which each command adds"},
		{"/v1", "without the /v1 of OPENAI_BASE_URL"},
	} {
		if prefix, ok := strings.CutSuffix(strings.TrimRight(u.Path, "/"), suffix.path); ok {
			return nil, fmt.Errorf("gateway URL %q: give the gateway's base URL, %s (-url %s)", config.RedactURL(baseURL), suffix.what, (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: prefix}).String())
		}
	}
	tokenFrom := ""
	if token == "" {
		dataDir := os.Getenv("TOLLGATE_DATA_DIR")
		if cfg != nil {
			dataDir = cfg.Server.DataDir
		}
		if dataDir == "" {
			dataDir = "./data"
		}
		tokenFile := filepath.Join(dataDir, "admin.token")
		tok, err := readAdminTokenFile(tokenFile)
		if errors.Is(err, os.ErrNotExist) {
			// Named in full: run beside a gateway started with an
			// exported TOLLGATE_ADMIN_TOKEN, "run where the gateway's
			// data dir is" sent the user to where they already were.
			return nil, fmt.Errorf("no admin token: -token and TOLLGATE_ADMIN_TOKEN are empty and %s does not exist; "+
				"a gateway given server.admin_token (TOLLGATE_ADMIN_TOKEN) writes none: pass that token with -token or TOLLGATE_ADMIN_TOKEN, "+
				"or run where the gateway's data dir is", absolutePath(tokenFile))
		}
		if err != nil {
			return nil, err
		}
		token, tokenFrom = tok, tokenFile
	}
	base := strings.TrimRight(baseURL, "/")
	return &adminClient{url: base, shown: config.RedactURL(base), token: token, tokenFrom: tokenFrom, http: &http.Client{Timeout: 15 * time.Second}}, nil
}

func (c *adminClient) call(method, path string, body any) error {
	out, err := c.fetch(method, path, body)
	if err != nil {
		return err
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, out, "", "  ") == nil {
		out = pretty.Bytes()
	}
	fmt.Println(string(out))
	return nil
}

// fetch calls the admin API and returns the body of a successful answer.
func (c *adminClient) fetch(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.url+"/admin/v1"+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		// Without url.Error's `Get "URL":`, which named the URL a second
		// time, in a redaction of its own (u:*** beside u:xxxxx).
		if urlErr := (*url.Error)(nil); errors.As(err, &urlErr) {
			err = urlErr.Err
		}
		return nil, fmt.Errorf("calling the gateway (is `tollgate serve` running at %s?): %w", c.shown, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		var pretty bytes.Buffer
		if json.Indent(&pretty, out, "", "  ") == nil {
			out = pretty.Bytes()
		}
		err := fmt.Errorf("%s: %s", resp.Status, out)
		if resp.StatusCode == http.StatusNotFound && bytes.Contains(out, []byte("no admin route")) {
			// A command newer than the gateway it calls.
			err = fmt.Errorf("%w\n(the gateway at %s does not have this route: it may run an older release than this tollgate, %s)", err, c.shown, version())
		}
		if resp.StatusCode == http.StatusUnauthorized && c.tokenFrom != "" {
			err = fmt.Errorf("%w\n(the refused admin token came from %s)", err, c.tokenFrom)
		}
		return nil, err
	}
	if resp.Header.Get("Idempotent-Replayed") == "true" {
		fmt.Fprintln(os.Stderr, "tollgate: a credit with this idempotency key was applied before: not applied again (the account as it is now:)")
	}
	return out, nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseInterleaved parses flags that may come after positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		// A negative amount is a value ("accounts credit acme -3"), not a
		// flag named 3.
		if len(args) > 0 && negativeNumber.MatchString(args[0]) {
			pos, args = append(pos, args[0]), args[1:]
			continue
		}
		// The flags up to the next negative amount: given to fs.Parse, it
		// was read as a flag after another flag ("accounts credit acme
		// -idempotency-key k -6": "does not take -6").
		n := flagsBeforeANegativeNumber(fs, args)
		if err := fs.Parse(args[:n]); err != nil {
			return nil, err
		}
		if n < len(args) {
			args = args[n:] // the negative amount first
			continue
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// flagsBeforeANegativeNumber is how many of args, a run of flags, come
// before the first negative number that is no flag's value ("-rpm -5"
// sets -5, as the flag package reads it); len(args) when there is none
// before the run ends (a positional argument or "--").
func flagsBeforeANegativeNumber(fs *flag.FlagSet, args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case negativeNumber.MatchString(a):
			return i
		case a == "--" || a == "-" || !strings.HasPrefix(a, "-"):
			return len(args)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) {
			i++ // its value
		}
	}
	return len(args)
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

var negativeNumber = regexp.MustCompile(`^-[0-9]+(\.[0-9]*)?$`)

// pathID is id as one segment of an admin path. Joined as it was typed,
// "accounts credit acme/../acme4 1" credited acme4 and "accounts get
// acme?x" got acme; an id that cannot be one segment ('/', '.', '..')
// is refused here, the rest escaped.
func pathID(what, id string) (string, error) {
	if id == "" || id == "." || id == ".." || strings.Contains(id, "/") {
		return "", fmt.Errorf("%s %q is not an id: an id holds no '/' and is not empty, '.' or '..'", what, id)
	}
	return url.PathEscape(id), nil
}

// errHelpShown: a command's -h printed its usage; nothing went wrong, and
// run exits 0.
var errHelpShown = errors.New("help shown")

func helpShownIsNoError(err error) error {
	if errors.Is(err, errHelpShown) {
		return nil
	}
	return err
}

// findSubcommand finds the subcommand args name in commands, the usage
// list of command: its usage line and the arguments it takes. With no
// subcommand, or an unknown one, it says so, then commandUsage: it
// printed the usage alone, without a word of what was wrong. -h prints
// commandUsage and returns errHelpShown.
func findSubcommand(commands, command, commandUsage string, args []string) (usage string, argNames []string, err error) {
	switch {
	case len(args) == 0:
		return "", nil, usageErrorf("%s needs a subcommand\n\n%s", command, commandUsage)
	case args[0] == "help" || isHelp(args[0]):
		fmt.Println(commandUsage)
		return "", nil, errHelpShown
	}
	usage, argNames, known := subcommand(commands, command, args[0])
	if !known {
		return "", nil, usageErrorf("unknown %s subcommand %q\n\n%s", command, args[0], commandUsage)
	}
	return usage, argNames, nil
}

// parseSubcommand parses the flags of a subcommand whose flag set holds
// only the flags it reads, usage its usage line. A flag it does not take
// is an error naming the ones it does: flags of another subcommand used
// to be accepted and ignored. -h prints usage and the flags, and returns
// errHelpShown. Its errors are usageErrors.
func parseSubcommand(fs *flag.FlagSet, usage string, args []string) ([]string, error) {
	pos, err := parseSubcommandFlags(fs, usage, args)
	if err != nil && !errors.Is(err, errHelpShown) {
		err = usageError{err}
	}
	return pos, err
}

func parseSubcommandFlags(fs *flag.FlagSet, usage string, args []string) ([]string, error) {
	fs.SetOutput(io.Discard) // the error below says it once, with more
	var repeated error
	own := map[*flag.Flag]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		own[f] = f.Value
		f.Value = &flagOnce{Value: f.Value, name: f.Name, repeated: &repeated}
	})
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		// PrintDefaults tells a default from a zero value by the value's
		// type: the flags' own, not flagOnce.
		fs.VisitAll(func(f *flag.Flag) { f.Value = own[f] })
		fmt.Printf("%s\n\nflags:\n", usage)
		fs.SetOutput(os.Stdout)
		fs.PrintDefaults()
		return nil, errHelpShown
	}
	if repeated != nil {
		return nil, repeated
	}
	if given, ok := strings.CutPrefix(fmt.Sprint(err), "flag provided but not defined: "); ok {
		var takes []string
		fs.VisitAll(func(f *flag.Flag) { takes = append(takes, "-"+f.Name) })
		return nil, fmt.Errorf("%s does not take %s; it takes %s", fs.Name(), given, strings.Join(takes, ", "))
	}
	if err != nil {
		return nil, err
	}
	// json.Marshal writes invalid UTF-8 as U+FFFD: "keys create demo
	// -name $'a\xffb'" made a key named "a\ufffdb".
	fs.Visit(func(f *flag.Flag) {
		if err == nil && !utf8.ValidString(f.Value.String()) {
			err = fmt.Errorf("-%s %q is not valid UTF-8: check the terminal's or the script's encoding", f.Name, f.Value)
		}
	})
	for _, a := range pos {
		if err == nil && !utf8.ValidString(a) {
			err = fmt.Errorf("%q is not valid UTF-8: check the terminal's or the script's encoding", a)
		}
	}
	return pos, err
}

// flagOnce is a flag's value that refuses a second one, as finance
// refuses a parameter given twice: the last of two used to win, so "keys
// create demo -name a -name b" named the key b without a word.
type flagOnce struct {
	flag.Value
	name, first string
	given       bool
	repeated    *error // set to the error of the flag given twice
}

func (f *flagOnce) Set(v string) error {
	if f.given {
		*f.repeated = fmt.Errorf("-%s is given twice (%q and %q): give each flag once", f.name, f.first, v)
		return *f.repeated
	}
	f.given, f.first = true, v
	return f.Value.Set(v)
}

// Get keeps the flag a flag.Getter, as every flag the flag package
// defines is: givenLimits reads the values given through it.
func (f *flagOnce) Get() any {
	if g, ok := f.Value.(flag.Getter); ok {
		return g.Get()
	}
	return f.Value.String()
}

// IsBoolFlag keeps a bool flag one that takes no value ("-logging").
func (f *flagOnce) IsBoolFlag() bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// accountsCommands lists the accounts subcommands, for `tollgate -h` and
// `tollgate accounts` alike: the help kept a list of its own, which
// missed the limits when they came.
const accountsCommands = `  accounts create ID [-credit USD] [-rpm N] [-tpm N] [-max-concurrent N]
  accounts get ID
  accounts list [-limit N] [-after ID]   a page of accounts by id; -after the page's last_id for the next
  accounts limits ID [-rpm N] [-tpm N] [-max-concurrent N]   set the limits given, keep the others
  accounts credit ID USD [-idempotency-key KEY]   a negative USD (-5, or -- -5) corrects credits made before
  accounts login ID      print a one-time web console sign-in link (15 minutes)
  accounts logout ID     end the account's console sessions and cancel its sign-in links`

const accountsUsage = "usage: tollgate accounts SUBCOMMAND, one of:\n" + accountsCommands

// subcommand finds the line of commands, a usage list, for the
// subcommand name of command ("accounts", "credit"): its usage, and the
// arguments it takes, the upper-case words the line writes right after
// the name ("ID", "USD"). ok is false for a name the list does not have.
// The list is the one place a subcommand's arguments are written.
func subcommand(commands, command, name string) (usage string, args []string, ok bool) {
	for _, line := range strings.Split(commands, "\n") {
		words := strings.Fields(line)
		if len(words) < 2 || words[0] != command || words[1] != name {
			continue
		}
		for _, w := range words[2:] {
			if strings.ContainsFunc(w, func(r rune) bool { return (r < 'A' || r > 'Z') && r != '_' }) {
				break
			}
			args = append(args, w)
		}
		return "usage: tollgate " + strings.TrimSpace(line), args, true
	}
	return "", nil, false
}

// checkArgs says which of names is missing from args, or which argument
// is one too many, then usage: a wrong count printed the usage of every
// subcommand, saying nothing of what was wrong.
func checkArgs(command string, args, names []string, usage string) error {
	switch {
	case len(args) < len(names):
		return usageErrorf("%s: %s is missing\n%s", command, names[len(args)], usage)
	case len(args) > len(names) && len(names) == 0:
		return usageErrorf("%s: unexpected argument %q (it takes none)\n%s", command, args[0], usage)
	case len(args) > len(names):
		return usageErrorf("%s: unexpected argument %q after %s\n%s", command, args[len(names)], names[len(names)-1], usage)
	}
	return nil
}

func runAccounts(args []string) error {
	usage, argNames, err := findSubcommand(accountsCommands, "accounts", accountsUsage, args)
	if err != nil {
		return helpShownIsNoError(err)
	}
	fs := flag.NewFlagSet("accounts "+args[0], flag.ContinueOnError)
	target := adminFlags(fs)
	// Each subcommand defines only the flags it reads: one set for all
	// took "create acme -idempotency-key x" and dropped the key.
	credit, idemKey := new(string), new(string)
	switch args[0] {
	case "list":
		decimalFlag(fs, "limit", "`N` accounts in the page, 1 to 1000 (default 100)")
		fs.String("after", "", "list the accounts after `ID`: the last_id of the page before")
	case "create":
		credit = fs.String("credit", "", "initial credit in USD, e.g. 10.00")
		limitFlags(fs)
	case "limits":
		limitFlags(fs)
	case "credit":
		idemKey = fs.String("idempotency-key", "", "a key (a payment id) that makes the same credit, sent again within 7 days, apply once")
	}
	pos, err := parseSubcommand(fs, usage, args[1:])
	if err != nil {
		return helpShownIsNoError(err)
	}
	if err := refuseGivenEmpty(fs, map[string]string{
		"idempotency-key": "give the payment's id, or leave the flag out to credit without one",
		"credit":          "give an amount such as 10.00, or leave the flag out for an account with no credit",
		"after":           "give the last_id of the page before, or leave the flag out for the first page",
	}); err != nil {
		return err
	}
	if err := checkArgs(fs.Name(), pos, argNames, usage); err != nil {
		return err
	}
	if args[0] == "limits" && len(givenLimits(fs)) == 0 {
		// An empty PATCH changed nothing and exited 0.
		return usageErrorf("%s: give at least one of -rpm, -tpm, -max-concurrent (0 = no limit)\n%s", fs.Name(), usage)
	}
	var account string // escaped for the path
	if args[0] != "create" && len(pos) > 0 {
		if account, err = pathID("account", pos[0]); err != nil {
			return err
		}
	}
	c, err := target.client(fs)
	if err != nil {
		return err
	}
	// checkArgs took the count each one reads.
	switch args[0] {
	case "create":
		body := givenLimits(fs)
		body["id"] = pos[0]
		if *credit != "" {
			body["credit_usd"] = *credit
		}
		return c.call("POST", "/accounts", body)
	case "limits":
		// Only the limits given change: "limits acme -rpm 60" keeps its tpm.
		return c.call("PATCH", "/accounts/"+account, givenLimits(fs))
	case "get":
		return c.call("GET", "/accounts/"+account, nil)
	case "list":
		// Only the flags given: the gateway's default page is its own.
		query := url.Values{}
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "limit" || f.Name == "after" {
				query.Set(f.Name, f.Value.String())
			}
		})
		path := "/accounts"
		if len(query) > 0 {
			path += "?" + query.Encode()
		}
		return c.call("GET", path, nil)
	case "credit":
		body := map[string]string{"usd": pos[1]}
		if *idemKey != "" {
			body["idempotency_key"] = *idemKey
		}
		return c.call("POST", "/accounts/"+account+"/credit", body)
	case "login":
		return printConsoleLogin(c, account, pos[0])
	case "logout":
		return c.call("POST", "/accounts/"+account+"/console-logout", nil)
	}
	return errors.New(accountsUsage)
}

// refuseGivenEmpty refuses a flag of instead given with an empty value,
// saying what to do instead: "-idempotency-key $PAYMENT_ID" with the
// variable unset read as no key, and a retried credit applied twice;
// "-expires-in $TTL" made a key that never expires.
func refuseGivenEmpty(fs *flag.FlagSet, instead map[string]string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if what, ok := instead[f.Name]; ok && err == nil && f.Value.String() == "" {
			err = fmt.Errorf("-%s is empty: %s", f.Name, what)
		}
	})
	return err
}

// limitFlags defines an account's limit flags on fs.
func limitFlags(fs *flag.FlagSet) {
	decimalFlag(fs, "rpm", "`N` requests per minute for all the account's keys together (0 = no limit)")
	decimalFlag(fs, "tpm", "`N` tokens per minute for all the account's keys together (0 = no limit)")
	decimalFlag(fs, "max-concurrent", "`N` generation and plugin calls in flight at once, per gateway (0 = no limit); bounds the overspend of calls started together")
}

// decimal is a number flag read in decimal only. flag's Int64 reads Go's
// literals: "-rpm 010" set 8, "-rpm 0x10" 16, "-tpm 0b101" 5, without a
// word. A leading 0 is refused, not read as decimal: a script that meant
// the octal would change meaning silently.
type decimal int64

// decimalFlag defines a decimal flag on fs.
func decimalFlag(fs *flag.FlagSet, name, usage string) *int64 {
	n := new(int64)
	fs.Var((*decimal)(n), name, usage)
	return n
}

func (d *decimal) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return errors.New("out of range")
	case err != nil:
		return errors.New("not a whole number in decimal, such as 60")
	}
	if digits := strings.TrimLeft(s, "+-"); len(digits) > 1 && digits[0] == '0' {
		return fmt.Errorf("a leading 0 is not taken (Go reads %s as octal); write %d", s, n)
	}
	*d = decimal(n)
	return nil
}

// String may be called on a nil d (flag.Value's contract).
func (d *decimal) String() string {
	if d == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*d), 10)
}

// Get makes the flag a flag.Getter: givenLimits sends the number.
func (d *decimal) Get() any { return int64(*d) }

// givenLimits is the body fields of the limit flags given on the command
// line, and only those.
func givenLimits(fs *flag.FlagSet) map[string]any {
	body := map[string]any{}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "rpm" || f.Name == "tpm" || f.Name == "max-concurrent" {
			body[strings.ReplaceAll(f.Name, "-", "_")] = f.Value.(flag.Getter).Get()
		}
	})
	return body
}

// printConsoleLogin prints a one-time web console sign-in link for the
// account. The link is the credential: send it to the account holder only.
func printConsoleLogin(c *adminClient, escaped, account string) error {
	out, err := c.fetch("POST", "/accounts/"+escaped+"/console-login", nil)
	if err != nil {
		return err
	}
	var login struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(out, &login); err != nil || login.URL == "" {
		return fmt.Errorf("unexpected answer from the gateway: %s", out)
	}
	fmt.Println(login.URL)
	fmt.Fprintf(os.Stderr, "One-time sign-in link for account %s: open it in a browser; it works once, until %s.\n",
		account, login.ExpiresAt.Local().Format("15:04:05 MST"))
	return nil
}

// keysCommands lists the keys subcommands, for `tollgate -h` and
// `tollgate keys` alike.
const keysCommands = `  keys create ACCOUNT -name NAME [-scopes a,b] [-models m1,m2] [-rpm N] [-tpm N] [-expires-in 720h] [-logging] [-retention-days N]
  keys list ACCOUNT
  keys get KEY_ID
  keys revoke KEY_ID`

func runKeys(args []string) error {
	const keysUsage = "usage: tollgate keys SUBCOMMAND, one of:\n" + keysCommands
	usage, argNames, err := findSubcommand(keysCommands, "keys", keysUsage, args)
	if err != nil {
		return helpShownIsNoError(err)
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	target := adminFlags(fs)
	if args[0] != "create" {
		// list, get and revoke take none of create's flags: "keys list
		// acme -name ci" listed every key as if the name filtered them.
		pos, err := parseSubcommand(fs, usage, args[1:])
		if err != nil {
			return helpShownIsNoError(err)
		}
		if err := checkArgs(fs.Name(), pos, argNames, usage); err != nil {
			return err
		}
		method, path, what := "GET", "/accounts/%s/keys", "account"
		switch args[0] {
		case "get":
			path, what = "/keys/%s", "key id"
		case "revoke":
			method, path, what = "DELETE", "/keys/%s", "key id"
		}
		id, err := pathID(what, pos[0])
		if err != nil {
			return err
		}
		c, err := target.client(fs)
		if err != nil {
			return err
		}
		return c.call(method, fmt.Sprintf(path, id), nil)
	}
	name := fs.String("name", "", "key name, e.g. prod-backend")
	scopes := fs.String("scopes", "", "comma-separated scopes (default: all)")
	models := fs.String("models", "", "comma-separated model ids (default: all)")
	rpm := decimalFlag(fs, "rpm", "`N` requests per minute (0 = none of its own: gateway.yaml's plugins.key_limits on the plugin endpoints, no limit on generation)")
	tpm := decimalFlag(fs, "tpm", "`N` tokens per minute (0 = none of its own, as for -rpm)")
	expiresIn := fs.String("expires-in", "", "lifetime, e.g. 720h (default: never)")
	logging := fs.Bool("logging", false, "log generation inputs and outputs for this key")
	retention := decimalFlag(fs, "retention-days", "`N` days to keep logged requests (0 = forever)")
	pos, err := parseSubcommand(fs, usage, args[1:])
	if err != nil {
		return helpShownIsNoError(err)
	}
	if err := checkArgs(fs.Name(), pos, argNames, usage); err != nil {
		return err
	}
	if err := refuseGivenEmpty(fs, map[string]string{
		"expires-in": "give a lifetime such as 720h, or leave the flag out for a key that never expires",
	}); err != nil {
		return err
	}
	account, err := pathID("account", pos[0])
	if err != nil {
		return err
	}
	if *retention != 0 && !*logging {
		return errors.New("-retention-days applies to logged requests: add -logging")
	}
	// Given but empty ("-scopes $SCOPES" with SCOPES unset) is not "all":
	// a script would mint a key that may call everything.
	var emptyList error
	fs.Visit(func(f *flag.Flag) {
		if (f.Name == "scopes" || f.Name == "models") && len(splitList(f.Value.String())) == 0 {
			emptyList = fmt.Errorf("-%s is empty: name at least one, or leave the flag out for all", f.Name)
		}
	})
	if emptyList != nil {
		return emptyList
	}
	c, err := target.client(fs)
	if err != nil {
		return err
	}
	body := map[string]any{"name": *name, "scopes": splitList(*scopes), "models": splitList(*models), "rpm": *rpm, "tpm": *tpm}
	if *expiresIn != "" {
		body["expires_in"] = *expiresIn
	}
	if *logging {
		body["logging"] = map[string]any{"enabled": true, "retention_days": *retention}
	}
	return c.call("POST", "/accounts/"+account+"/keys", body)
}

const configUsage = "usage: tollgate config check [FILE] | tollgate config get SETTING [FILE] (SETTING as server.data_dir)"

// configCheckUsage is printed by "config check -h".
const configCheckUsage = `usage: tollgate config check [FILE | -config FILE]

Loads the config file (default $TOLLGATE_CONFIG, else ./gateway.yaml) as
serve and a reload do, and prints every error with file:line:col, or
"FILE: ok". With server.admin_token empty it reads data_dir/admin.token
too, when it is there, as serve does at start; and it refuses, as serve
does, an HTTPS_PROXY (or https_proxy) that an https upstream would go
through and that is no http:// proxy URL. Exits 1 on an invalid file.
`

// configGetUsage is printed by "config get -h".
const configGetUsage = `usage: tollgate config get SETTING [FILE | -config FILE]

Prints one setting of the config file (default $TOLLGATE_CONFIG, else
./gateway.yaml) as it reads after loading: variables expanded and config
defaults filled in. A value the gateway derives only when it runs is not
filled in: storage.local.public_base_url left empty prints an empty line
(serve uses http://<storage.local.listen>). SETTING is a path in the file:
server.data_dir, models.0.id (a list item by its index),
classifiers.NAME.mode (a map entry by its key). A duration prints as the
file writes it (8760h), a list of plain values one item a line.
`

func runConfig(args []string) error {
	if len(args) >= 1 && args[0] == "get" {
		return printSetting(args[1:])
	}
	switch {
	case len(args) == 0:
		return usageErrorf("%s", configUsage)
	case asksHelp(args[:1]):
		fmt.Println(configUsage)
		return nil
	case args[0] != "check":
		// It printed the usage and exited 1, not naming what it refused.
		return usageErrorf("unknown config subcommand %q\n%s", args[0], configUsage)
	}
	if slices.ContainsFunc(args[1:], isHelp) {
		// Answered "the config file is FILE or -config FILE" as an error.
		fmt.Print(configCheckUsage)
		return nil
	}
	// More than one file used to check the first and say ok.
	path, err := configArg(args[1:])
	if err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return loadError(path, err)
	}
	// serve refuses an admin token file it cannot use; one that is not
	// there yet is made at start.
	if cfg.Server.AdminToken == "" {
		_, err := readAdminTokenFile(filepath.Join(cfg.Server.DataDir, "admin.token"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: server.data_dir: %w", path, err)
		}
	}
	// serve reads HTTPS_PROXY when it builds the upstreams, and exits on
	// one it cannot use: checked here, in its words.
	if err := proxy.CheckEgress(cfg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, line := range cfg.Warnings(os.Environ()) {
		fmt.Fprintln(os.Stderr, line)
	}
	fmt.Printf("%s: ok\n", path)
	return nil
}

// loadError is config check's and config get's word on a config file
// that did not load: one that cannot be read (missing, a directory, not
// permitted) said "is invalid: reading config: open …", as if it held
// mistakes.
func loadError(path string, err error) error {
	var invalid *config.Errors
	var unread *fs.PathError
	if !errors.As(err, &invalid) && errors.As(err, &unread) {
		return fmt.Errorf("%s cannot be read: %w", path, unread)
	}
	return fmt.Errorf("%s is invalid:\n%w", path, err)
}

// printSetting prints the setting args name, of the config file they name,
// as the file reads after loading (variables expanded, config defaults
// filled in): scripts that start a gateway need what it will use, and make
// run took its data_dir from TOLLGATE_DATA_DIR alone, so a second run on
// another config's data_dir shared, and then lost, the first one's
// ClickHouse.
func printSetting(args []string) error {
	setting, fileArgs, help := settingArgs(args)
	if help {
		fmt.Print(configGetUsage)
		return nil
	}
	path, err := configArg(fileArgs) // an unknown flag is named first
	if err != nil {
		return err
	}
	if setting == "" {
		return usageErrorf("config get needs the setting to print\n%s", configGetUsage)
	}
	cfg, err := config.LoadNotConnecting(path)
	if err != nil {
		return loadError(path, err)
	}
	v, err := config.Setting(cfg, setting)
	if err != nil {
		return err
	}
	fmt.Println(v)
	return nil
}

// settingArgs splits config get's arguments into the setting and what
// configArg reads, the flags first: "config get -config x.yaml
// server.listen" once read -config as the setting and refused two files.
// help is set by -h or -help anywhere.
func settingArgs(args []string) (setting string, fileArgs []string, help bool) {
	var flags, files []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			if setting == "" {
				setting = a
			} else {
				files = append(files, a)
			}
			continue
		}
		switch name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "="); {
		case name == "h" || name == "help":
			return "", nil, true
		case name == "config" && !hasValue && i+1 < len(args):
			flags = append(flags, a, args[i+1])
			i++
		default:
			flags = append(flags, a)
		}
	}
	return setting, append(flags, files...), false
}
