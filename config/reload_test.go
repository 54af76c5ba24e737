package config

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor

// configWith returns a small valid gateway.yaml serving the given model ids.
func configWith(listen string, ids ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server:\n  listen: %s\nupstreams:\n  - name: default\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n", listen)
	for _, id := range ids {
		fmt.Fprintf(&b, "  - id: %s\n    context_length: 4096\n    max_output_length: 512\n", id)
	}
	return b.String()
}

// replaceFile writes data the way many editors save: a new file renamed
// over the old one, so the watched path gets a new inode.
func replaceFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// logBuffer collects a Watcher's log lines; Run logs from its own goroutine.
type logBuffer struct{ testutil.Log }

func (l *logBuffer) contains(s string) error {
	if l.Count(s) > 0 {
		return nil
	}
	return fmt.Errorf("no log line contains %q; log:\n%s", s, &l.Log)
}

type watchFixture struct {
	path   string
	w      *Watcher
	log    *logBuffer
	builds atomic.Int32
}

// newWatchFixture writes content to a fresh file and watches it. buildErr,
// when set, makes every build fail.
func newWatchFixture(t *testing.T, content string, buildErr error) *watchFixture {
	t.Helper()
	f := &watchFixture{path: filepath.Join(t.TempDir(), "gateway.yaml"), log: &logBuffer{}}
	if err := os.WriteFile(f.path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	initial, err := Load(f.path)
	if err != nil {
		t.Fatal(err)
	}
	f.w = NewWatcher(f.path, initial, func(*Config) error {
		f.builds.Add(1)
		return buildErr
	}, f.log.Logf)
	f.w.settle = 0 // TestWatcherWaitsForAFileToSettle tests it
	return f
}

func (f *watchFixture) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func modelIDs(c *Config) string {
	ids := make([]string, len(c.Models))
	for i, m := range c.Models {
		ids[i] = m.ID
	}
	return strings.Join(ids, ",")
}

func wantModels(w *Watcher, want string) func() error {
	return func() error {
		if got := modelIDs(w.Current()); got != want {
			return fmt.Errorf("models %q, want %q", got, want)
		}
		return nil
	}
}

func TestWatcherReloadsEditedFile(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	f.run(t)

	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a", "b"))
	checkFor(t, 2*time.Second, 20*time.Millisecond, wantModels(f.w, "a,b"))

	// Written in place, same inode.
	if err := os.WriteFile(f.path, []byte(configWith("127.0.0.1:8080", "c")), 0o644); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 2*time.Second, 20*time.Millisecond, wantModels(f.w, "c"))
	if err := f.log.contains("config reloaded from " + f.path); err != nil {
		t.Error(err)
	}
	if n := f.builds.Load(); n != 2 {
		t.Errorf("build called %d times, want 2", n)
	}
}

// A file written in two steps parses after the first: its models without
// their prices, or with half of them. Only what stayed unchanged for the
// settle time is applied.
func TestWatcherWaitsForAFileToSettle(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	f.w.settle = 300 * time.Millisecond
	full := configWith("127.0.0.1:8080", "a", "b", "c")
	cut := strings.LastIndex(full, "- id: c")
	if cut < 0 {
		t.Fatalf("no model c in %q", full)
	}
	if err := os.WriteFile(f.path, []byte(full[:cut]), 0o644); err != nil {
		t.Fatal(err)
	}
	f.w.poll()
	if err := wantModels(f.w, "a")(); err != nil {
		t.Fatalf("the first half was applied at once: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	fh, err := os.OpenFile(f.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString(full[cut:]); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	time.Sleep(250 * time.Millisecond) // the first half would have settled by now
	f.w.poll()
	if err := wantModels(f.w, "a")(); err != nil {
		t.Fatalf("applied before the whole file had settled: %v", err)
	}
	time.Sleep(350 * time.Millisecond)
	f.w.poll()
	if err := wantModels(f.w, "a,b,c")(); err != nil {
		t.Fatal(err)
	}
	if n := f.builds.Load(); n != 1 {
		t.Errorf("build called %d times, want once, for the whole file", n)
	}
}

// A file written in pieces and applied at once by SIGHUP left its first
// piece remembered as "seen" since long ago: the next time the same first
// piece was written, a poll applied it at once, a model short (found by
// a black-box session: rounds 2 and 3 of write, SIGHUP, write dropped a
// model within 0.3 s). A reload forgets what the polls saw before it.
func TestWatcherReloadForgetsASeenPartialFile(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	f.w.settle = 300 * time.Millisecond
	full := configWith("127.0.0.1:8080", "a", "b", "c")
	cut := strings.LastIndex(full, "- id: c")
	for round := range 3 {
		if err := os.WriteFile(f.path, []byte(full[:cut]), 0o644); err != nil {
			t.Fatal(err)
		}
		f.w.poll()
		if got := modelIDs(f.w.Current()); round > 0 && got != "a,b,c" || round == 0 && got != "a" {
			t.Fatalf("round %d: the first piece was applied at once: models %q", round, got)
		}
		time.Sleep(400 * time.Millisecond) // longer than settle, without a poll
		if err := os.WriteFile(f.path, []byte(full), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := f.w.Reload(); err != nil { // SIGHUP
			t.Fatal(err)
		}
		if err := wantModels(f.w, "a,b,c")(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

func TestWatcherIgnoresTouchWithoutChange(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	before := f.w.Current()
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(f.path, later, later); err != nil {
		t.Fatal(err)
	}
	f.w.poll()
	// The same bytes through a rename: new inode, same content.
	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a"))
	f.w.poll()
	if f.w.Current() != before || f.builds.Load() != 0 {
		t.Fatalf("unchanged content reloaded (builds: %d)", f.builds.Load())
	}
	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a", "b"))
	f.w.poll()
	if err := wantModels(f.w, "a,b")(); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherKeepsOldConfigOnInvalidEdit(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	before := f.w.Current()
	f.run(t)

	bad := configWith("127.0.0.1:8080", "a", "b") + "    pricng: {}\n"
	replaceFile(t, f.path, bad)
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		return f.log.contains(`unknown field "pricng" in models[1] (did you mean "pricing"?)`)
	})
	if err := f.log.contains("keeping the running config"); err != nil {
		t.Error(err)
	}
	if f.w.Current() != before || f.builds.Load() != 0 {
		t.Fatalf("invalid file replaced the config (builds: %d)", f.builds.Load())
	}
	var errs *Errors
	if err := f.w.Reload(); !errors.As(err, &errs) || len(*errs) != 1 {
		t.Fatalf("Reload() = %v, want *Errors with one entry", err)
	}

	// Fixing the file is picked up.
	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a", "b"))
	checkFor(t, 2*time.Second, 20*time.Millisecond, wantModels(f.w, "a,b"))
}

func TestWatcherRefusesRestartOnlyChange(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	before := f.w.Current()
	replaceFile(t, f.path, configWith("127.0.0.1:9999", "a", "b")+"nats:\n  replicas: 3\n")

	err := f.w.Reload()
	var restart *RestartRequiredError
	if !errors.As(err, &restart) {
		t.Fatalf("Reload() = %v, want *RestartRequiredError", err)
	}
	const want = "config reload not supported for server.listen (line 2), nats.replicas (line 14) (restart required)"
	if err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if err := f.log.contains(want); err != nil {
		t.Error(err)
	}
	if f.w.Current() != before || f.builds.Load() != 0 {
		t.Fatal("restart-only change was applied")
	}
}

// auth.issuer reloaded "successfully" while the account store kept
// signing and checking keys with the issuer it opened with; now the reload
// is refused by name, like every other setting read once at start.
func TestWatcherRefusesIssuerChange(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	before := f.w.Current()
	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a")+"auth:\n  issuer: someone-else\n")
	const want = "config reload not supported for auth.issuer (line 11) (restart required)"
	if err := f.w.Reload(); err == nil || err.Error() != want {
		t.Fatalf("Reload() = %v, want %q", err, want)
	}
	if err := f.log.contains(want); err != nil {
		t.Error(err)
	}
	if f.w.Current() != before || f.w.Current().Auth.Issuer != "tollgate" || f.builds.Load() != 0 {
		t.Fatal("issuer change was applied")
	}
}

// A reload changing demo_credit_usd said "config reloaded" and changed
// nothing: the demo account is made once, at the first start. It still
// reloads (nothing is wrong), and says the change has no effect.
func TestWatcherSaysAFirstStartSettingHasNoEffect(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	replaceFile(t, f.path, "x-note: 1\n"+configWith("127.0.0.1:8080", "a"))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, f.path, strings.Replace(configWith("127.0.0.1:8080", "a"), "server:\n", "server:\n  demo_credit_usd: \"20\"\n", 1))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	if notes := f.log.Count("server.demo_credit_usd is read only at a gateway's first start"); notes != 1 {
		t.Fatalf("%d notes about demo_credit_usd, want 1 (for the second reload); log:\n%s", notes, &f.log.Log)
	}
}

func TestWatcherKeepsOldConfigWhenBuildFails(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), errors.New("upstream client refused"))
	before := f.w.Current()
	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a", "b"))
	if err := f.w.Reload(); err == nil || !strings.Contains(err.Error(), "upstream client refused") {
		t.Fatalf("Reload() = %v, want build's error", err)
	}
	if f.w.Current() != before || f.builds.Load() != 1 {
		t.Fatalf("failed build replaced the config (builds: %d)", f.builds.Load())
	}
}

// No metric told an operator that a reload failed: the old config kept
// serving and only the log said why. LastReload is what /metrics shows.
func TestWatcherReportsTheLastReload(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	ok, started := f.w.LastReload()
	if !ok || time.Since(started) > time.Minute {
		t.Fatalf("at start: %v at %v, want a success now", ok, started)
	}
	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a")+"    pricng: {}\n")
	if f.w.Reload() == nil {
		t.Fatal("an invalid file reloaded")
	}
	ok, failed := f.w.LastReload()
	if ok || !failed.After(started) {
		t.Fatalf("after an invalid file: %v at %v, want a failure after %v", ok, failed, started)
	}
	replaceFile(t, f.path, configWith("127.0.0.1:9999", "a"))
	f.w.poll() // a restart-only change, found by a poll: a failure too
	if ok, at := f.w.LastReload(); ok || at.Before(failed) {
		t.Fatalf("after a restart-only change: %v at %v", ok, at)
	}
	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a", "b"))
	f.w.poll()
	if ok, at := f.w.LastReload(); !ok || at.Before(failed) {
		t.Fatalf("after a good file: %v at %v", ok, at)
	}
}

// A SIGHUP while the file was away (rm, or a k8s symlink moved) set
// tollgate_config_last_reload_success to 0, and putting the same bytes
// back left it 0 for as long as the file stayed so: the poll saw the
// content it had read last and looked no further. An invalid edit undone
// is the same file in force again; neither rebuilds what is in force.
func TestWatcherReportsSuccessWhenTheFileInForceIsBack(t *testing.T) {
	inForce := configWith("127.0.0.1:8080", "a")
	f := newWatchFixture(t, inForce, nil)
	before := f.w.Current()

	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	if f.w.Reload() == nil {
		t.Fatal("Reload of a missing file succeeded")
	}
	if ok, _ := f.w.LastReload(); ok {
		t.Fatal("a missing file reported a success")
	}
	replaceFile(t, f.path, inForce)
	f.w.poll()
	if ok, _ := f.w.LastReload(); !ok {
		t.Fatal("the file in force put back: the last reload still reports a failure")
	}

	replaceFile(t, f.path, inForce+"    pricng: {}\n")
	f.w.poll()
	if ok, _ := f.w.LastReload(); ok {
		t.Fatal("an invalid edit reported a success")
	}
	replaceFile(t, f.path, inForce)
	f.w.poll()
	if ok, _ := f.w.LastReload(); !ok {
		t.Fatal("the invalid edit undone: the last reload still reports a failure")
	}
	if f.w.Current() != before || f.builds.Load() != 0 {
		t.Fatalf("the file in force was built again (builds: %d)", f.builds.Load())
	}
	if err := f.log.contains("is the config in force again"); err != nil {
		t.Error(err)
	}

	// Moved away and back (mv keeps the inode, size and time): the same
	// file as before looked unchanged to poll, and the failure stood.
	away := f.path + ".away"
	if err := os.Rename(f.path, away); err != nil {
		t.Fatal(err)
	}
	if f.w.Reload() == nil {
		t.Fatal("Reload of a file moved away succeeded")
	}
	f.w.poll()
	if err := os.Rename(away, f.path); err != nil {
		t.Fatal(err)
	}
	f.w.poll()
	if ok, _ := f.w.LastReload(); !ok {
		t.Fatal("the file in force moved back: the last reload still reports a failure")
	}
}

func TestWatcherReloadsOnSIGHUP(t *testing.T) {
	// Our own handler first: should Run fail to catch SIGHUP, the signal
	// is still not fatal to the test binary.
	guard := make(chan os.Signal, 1)
	signal.Notify(guard, syscall.SIGHUP)
	defer signal.Stop(guard)

	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	f.w.pollEvery = time.Hour // only the signal can cause a reload
	f.run(t)
	<-f.w.signalsReady

	replaceFile(t, f.path, configWith("127.0.0.1:8080", "a", "hup"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 2*time.Second, 20*time.Millisecond, wantModels(f.w, "a,hup"))
	if err := f.log.contains("SIGHUP"); err != nil {
		t.Error(err)
	}
}

// TestWatcherCurrentIsRaceFree reads the config from several goroutines
// while reloads swap it; run with -race.
func TestWatcherCurrentIsRaceFree(t *testing.T) {
	f := newWatchFixture(t, configWith("127.0.0.1:8080", "a"), nil)
	f.run(t)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	var reads atomic.Int64
	for range 4 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := f.w.Current()
				if len(c.Models) == 0 || c.Models[0].ID != "a" || c.Upstreams[0].Name != "default" {
					t.Errorf("inconsistent snapshot: %+v", c.Models)
					return
				}
				reads.Add(1)
			}
		})
	}
	// The reloads wait for the readers: on a loaded runner all 20 were
	// done before any reader was scheduled, and the test failed with
	// "readers never ran".
	for deadline := time.Now().Add(10 * time.Second); reads.Load() < 4; {
		if time.Now().After(deadline) {
			t.Fatal("readers never ran")
		}
		runtime.Gosched()
	}
	for i := range 20 {
		ids := []string{"a"}
		if i%2 == 0 {
			ids = append(ids, fmt.Sprintf("m%d", i))
		}
		replaceFile(t, f.path, configWith("127.0.0.1:8080", ids...))
		if err := f.w.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	readers.Wait()
	if got := modelIDs(f.w.Current()); got != "a" {
		t.Fatalf("final models %q, want a", got)
	}
}

// A pricing block deleted (or moved to another entry by a slip) made a
// paid model free, and the reload said only "config reloaded". It warns
// now, naming each model that had a price; one never priced, or priced
// still, is not named.
func TestWatcherWarnsOfAPricedModelMadeFree(t *testing.T) {
	const file = "upstreams:\n  - name: default\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n" +
		"  - id: paid\n    context_length: 4096\n    max_output_length: 512\n%s" +
		"  - id: also-paid\n    context_length: 4096\n    max_output_length: 512\n%s" +
		"  - id: still-paid\n    context_length: 4096\n    max_output_length: 512\n    pricing: {prompt: \"0.000001\", completion: \"0.000002\"}\n" +
		"  - id: never-paid\n    context_length: 4096\n    max_output_length: 512\n"
	const priced = "    pricing: {prompt: \"0.000001\", completion: \"0.000002\"}\n"
	f := newWatchFixture(t, fmt.Sprintf(file, priced, priced), nil)
	replaceFile(t, f.path, fmt.Sprintf(file, "", "    pricing: {prompt: \"0\", completion: \"0\"}\n"))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	const want = "warning: models paid, also-paid had a price and are free now (no pricing block, or every price 0): their calls are billed nothing from this reload on"
	if err := f.log.contains(want); err != nil {
		t.Error(err)
	}
	if err := f.log.contains("never-paid"); err == nil {
		t.Error("a model never priced was named")
	}
	if err := f.log.contains("still-paid"); err == nil {
		t.Error("a model priced still was named")
	}
}

// A reload that succeeded said only "config reloaded from gateway.yaml",
// and one that brought in what config check warns of (a retry_budget a
// pool member's first_byte_timeout outlasts) said nothing more: the
// warning was seen only at the next start. The line names what changed,
// and the warnings the reload brought in follow it, once.
func TestWatcherSaysWhatAReloadChangedAndWarnsAsConfigCheck(t *testing.T) {
	const file = "upstreams:\n  - {name: a, base_url: http://127.0.0.1:8000/v1, first_byte_timeout: %s}\n" +
		"  - {name: b, base_url: http://127.0.0.1:8001/v1}\n" +
		"models:\n  - {id: pooled, context_length: 4096, max_output_length: 512, upstreams: [a, b]}\n" +
		"  - {id: %s, context_length: 4096, max_output_length: 512, upstream: b}\n"
	f := newWatchFixture(t, fmt.Sprintf(file, "60s", "m"), nil)
	replaceFile(t, f.path, fmt.Sprintf(file, "5m", "m2")+"routing:\n  balance: round_robin\n")
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := f.log.contains("config reloaded from " + f.path + "; changed: upstreams (a), models (m2, m), routing"); err != nil {
		t.Error(err)
	}
	const warning = "warning: routing.retry_budget (2m0s) is not above the first_byte_timeout of pool member a"
	if err := f.log.contains(warning); err != nil {
		t.Error(err)
	}
	// The same file again: nothing changed, and the warning in force is
	// not said again.
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	lines := f.log.Matching()
	last, warned := lines[len(lines)-1], 0
	for _, line := range lines {
		if strings.HasPrefix(line, warning) {
			warned++
		}
	}
	if want := "config reloaded from " + f.path + "; changed: nothing"; last != want {
		t.Errorf("reloading the same file logged %q last, want %q", last, want)
	}
	if warned != 1 {
		t.Errorf("the warning was logged %d times, want once; log:\n%s", warned, strings.Join(lines, "\n"))
	}
}
