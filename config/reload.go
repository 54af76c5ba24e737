package config

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Watcher holds the current config and replaces it when the file changes or
// the process gets SIGHUP. Current is safe from any goroutine at any time;
// a *Config it returns is never modified, so readers keep a consistent
// snapshot for as long as they hold it.
type Watcher struct {
	path    string
	build   func(*Config) error
	logf    func(format string, args ...any)
	current atomic.Pointer[Config]

	pollEvery time.Duration
	// settle is how long a changed file must stay the same before it is
	// applied: a file written in pieces (`cat a > f; cat b >> f`, an editor
	// without rename) parses at every cut between two lines, and a model
	// whose completion price is not written yet is a model billed 0.
	settle time.Duration
	// signalsReady is closed once Run listens for SIGHUP (tests wait on it
	// before signalling, or the signal would kill the process).
	signalsReady chan struct{}
	readyOnce    sync.Once

	// lastOK and lastAt are the outcome and time (Unix ns) of the last
	// reload attempt, the load at start until there is one: nothing else
	// tells a dashboard that the file in place is not the one in force.
	lastOK atomic.Bool
	lastAt atomic.Int64

	mu       sync.Mutex // serializes reloads; guards the fields below
	lastStat os.FileInfo
	lastHash [32]byte
	missing  bool
	// seenHash is the changed content the last poll read, first read at
	// seenSince: applied once it has stayed for settle.
	seenHash  [32]byte
	seenSince time.Time
}

// NewWatcher watches path, starting from initial, which must be what
// Load(path) returned (not nil).
//
// build is called with every new valid config before it becomes current: it
// builds everything derived from the config (catalog, upstream clients) and
// swaps it in, or returns an error to keep the running config. Reloads are
// serialized, so build never runs twice at once; it must not call Reload.
// A nil build accepts every valid config; a nil logf logs with package log.
func NewWatcher(path string, initial *Config, build func(*Config) error, logf func(format string, args ...any)) *Watcher {
	if build == nil {
		build = func(*Config) error { return nil }
	}
	if logf == nil {
		logf = log.Printf
	}
	w := &Watcher{
		path:         path,
		build:        build,
		logf:         logf,
		pollEvery:    500 * time.Millisecond,
		settle:       time.Second,
		signalsReady: make(chan struct{}),
		lastHash:     initial.source,
	}
	w.current.Store(initial)
	w.lastOK.Store(true)
	w.lastAt.Store(time.Now().UnixNano())
	return w
}

// LastReload reports whether the last reload attempt (by poll or SIGHUP)
// applied the file, and when it was made; before any, the load at start,
// a success. Safe from any goroutine.
func (w *Watcher) LastReload() (ok bool, at time.Time) {
	return w.lastOK.Load(), time.Unix(0, w.lastAt.Load())
}

// attempted records a reload attempt's outcome for LastReload.
func (w *Watcher) attempted(err error) error {
	w.lastAt.Store(time.Now().UnixNano())
	w.lastOK.Store(err == nil)
	return err
}

// Current returns the config in force.
func (w *Watcher) Current() *Config { return w.current.Load() }

// CatchSIGHUP starts catching SIGHUP for a Watcher made later, so that
// one sent while the process starts is a reload once it runs, not the
// signal's default, which ends the process (systemd's reload right after
// start did, and counts that a clean exit: no restart). Pass the channel
// to RunOn.
func CatchSIGHUP() chan os.Signal {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup
}

// Run polls the file every 500ms, applies a changed file once it has
// stayed the same for a second, and reloads at once on SIGHUP, until ctx
// is done.
// Call it once, in its own goroutine.
func (w *Watcher) Run(ctx context.Context) {
	w.RunOn(ctx, CatchSIGHUP())
}

// RunOn is Run with the SIGHUP channel CatchSIGHUP returned.
func (w *Watcher) RunOn(ctx context.Context, hup chan os.Signal) {
	defer signal.Stop(hup)
	w.readyOnce.Do(func() { close(w.signalsReady) })

	tick := time.NewTicker(w.pollEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			w.logf("SIGHUP: reloading %s", w.path)
			_ = w.Reload() // Reload logs its outcome
		case <-tick.C:
			w.poll()
		}
	}
}

// Reload reads the file and applies it now, whether or not it changed. On
// any failure the running config stays, the reason is logged and returned:
// *Errors for an invalid file, *RestartRequiredError for a change that needs
// a restart, or build's error.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Stat before reading: a change racing the read then shows at the
	// next poll instead of hiding behind a stat taken after it.
	fi, statErr := os.Stat(w.path)
	data, err := os.ReadFile(w.path)
	if err != nil {
		err = fmt.Errorf("config reload: %w", err)
		w.logf("%v; keeping the running config", err)
		// Whatever is at the path next is read: the same file moved back
		// (mv keeps its inode, size and time) looked unchanged to poll,
		// and the failure stood until the file was edited.
		w.lastStat = nil
		return w.attempted(err)
	}
	if statErr == nil {
		w.lastStat = fi
	}
	return w.apply(data)
}

// poll reloads when the file's content changed. The stat check keeps idle
// polls cheap; the hash keeps a touch, or an editor rewriting the same
// bytes, from reloading, and the content in force, when back, from being
// built again. Stat follows the path, so an editor that writes a
// new file and renames it over the old one is seen too.
func (w *Watcher) poll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	fi, err := os.Stat(w.path)
	if err != nil {
		// Some editors remove the file for a moment while saving; say so
		// once and look again next tick.
		if !w.missing {
			w.logf("config watch: %v", err)
			w.missing = true
		}
		w.lastStat = nil // see Reload
		return
	}
	w.missing = false
	if prev := w.lastStat; prev != nil && os.SameFile(prev, fi) &&
		prev.Size() == fi.Size() && prev.ModTime().Equal(fi.ModTime()) {
		return
	}
	data, err := os.ReadFile(w.path)
	if err != nil {
		w.logf("config watch: %v", err)
		return
	}
	sum := sha256.Sum256(data)
	// The config in force is back (an invalid edit undone, or the file
	// put back after a reload that could not read it): nothing to apply,
	// but the failure LastReload reports is over.
	inForce := sum == w.current.Load().source
	if sum == w.lastHash || inForce {
		w.lastStat, w.lastHash, w.seenHash = fi, sum, [32]byte{}
		if inForce && !w.lastOK.Load() {
			w.logf("config file %s is the config in force again", w.path)
			_ = w.attempted(nil)
		}
		return
	}
	now := time.Now()
	if sum != w.seenHash {
		w.seenHash, w.seenSince = sum, now
	}
	if now.Sub(w.seenSince) < w.settle {
		return // still being written, maybe: look again next tick
	}
	w.lastStat = fi
	_ = w.apply(data) // apply logs its outcome
}

// apply parses data and makes it current if it is valid, changes nothing
// that needs a restart, and build accepts it; LastReload reports the
// outcome. w.mu must be held.
func (w *Watcher) apply(data []byte) error {
	return w.attempted(w.applyData(data))
}

func (w *Watcher) applyData(data []byte) error {
	// Remember even a refused file: it is reported once, not every tick.
	w.lastHash = sha256.Sum256(data)
	// What the polls saw before is history now: a piece of the file seen
	// then and written again later (the same first half, next round) must
	// wait its settle time afresh, not count from the old sighting.
	w.seenHash, w.seenSince = [32]byte{}, time.Time{}
	cfg, err := parse(w.path, data, os.LookupEnv)
	if err != nil {
		w.logf("config reload failed; keeping the running config:")
		var errs *Errors
		if errors.As(err, &errs) {
			for _, e := range *errs {
				w.logf("  %v", e)
			}
		} else {
			w.logf("  %v", err)
		}
		return err
	}
	if changed := cfg.RestartOnlyDiff(w.current.Load()); len(changed) > 0 {
		err := &RestartRequiredError{Fields: changed, Reasons: cfg.restartOnlyReasons(w.current.Load(), changed)}
		w.logf("%v; keeping the running config", err)
		return err
	}
	if err := w.build(cfg); err != nil {
		err = fmt.Errorf("config reload: applying %s: %w", w.path, err)
		w.logf("%v; keeping the running config", err)
		return err
	}
	old := w.current.Swap(cfg)
	changed := "; changed: " + cfg.changedNames(old)
	if unused := cfg.firstStartOnlyDiff(old); len(unused) > 0 {
		w.logf("config reloaded from %s%s; %s is read only at a gateway's first start: the change has no effect here", w.path, changed, strings.Join(unused, ", "))
	} else {
		w.logf("config reloaded from %s%s", w.path, changed)
	}
	// What config check would warn of, once: a reload that brought in a
	// retry_budget under a pool member's first_byte_timeout said only
	// "config reloaded".
	environ := os.Environ()
	before := old.Warnings(environ)
	for _, line := range cfg.Warnings(environ) {
		if !slices.Contains(before, line) {
			w.logf("%s", line)
		}
	}
	switch freed := cfg.freedModels(old); {
	case len(freed) == 1:
		w.logf("warning: model %s had a price and is free now (no pricing block, or every price 0): its calls are billed nothing from this reload on; write its pricing back if that is not meant", freed[0])
	case len(freed) > 1:
		w.logf("warning: models %s had a price and are free now (no pricing block, or every price 0): their calls are billed nothing from this reload on; write their pricing back if that is not meant", strings.Join(freed, ", "))
	}
	return nil
}

// changedNames names, on one line, what differs between old and c: the
// top-level sections, and within upstreams and models the entries (by
// name and id) changed, added or removed; "nothing" when none is.
func (c *Config) changedNames(old *Config) string {
	var parts []string
	cv, ov := reflect.ValueOf(c).Elem(), reflect.ValueOf(old).Elem()
	for i := range cv.NumField() {
		name := yamlName(cv.Type().Field(i))
		if name == "" || reflect.DeepEqual(cv.Field(i).Interface(), ov.Field(i).Interface()) {
			continue
		}
		switch name {
		case "upstreams":
			name += entriesChanged(c.Upstreams, old.Upstreams, func(u Upstream) string { return u.Name })
		case "models":
			name += entriesChanged(c.Models, old.Models, func(m Model) string { return m.ID })
		}
		parts = append(parts, name)
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// entriesChanged is " (a, b)": the names of the entries of now and before
// that differ, are new, or are gone, in the order of now and then of
// before; "" when only their order changed.
func entriesChanged[T any](now, before []T, name func(T) string) string {
	was := make(map[string]T, len(before))
	for _, e := range before {
		was[name(e)] = e
	}
	var names []string
	seen := map[string]bool{}
	for _, e := range now {
		n := name(e)
		seen[n] = true
		if old, ok := was[n]; !ok || !reflect.DeepEqual(e, old) {
			names = append(names, n)
		}
	}
	for _, e := range before {
		if !seen[name(e)] {
			names = append(names, name(e))
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}

// freedModels names the models of c that old priced and c does not: a
// pricing block deleted, or moved to another model's entry by a slip,
// makes a paid model free, which the reload applied in silence.
func (c *Config) freedModels(old *Config) []string {
	pricedBefore := map[string]bool{}
	for _, m := range old.Models {
		pricedBefore[m.ID] = m.Pricing.priced()
	}
	var freed []string
	for _, m := range c.Models {
		if pricedBefore[m.ID] && !m.Pricing.priced() {
			freed = append(freed, m.ID)
		}
	}
	return freed
}

// priced reports whether any price of p is above 0.
func (p Pricing) priced() bool {
	for _, v := range []string{p.Prompt, p.Completion, p.Image, p.Request, p.InputCacheRead} {
		if price, err := parsePrice(v); err == nil && price > 0 {
			return true
		}
	}
	return false
}

// firstStartOnlyDiff names the settings that differ between old and c
// but are read only at a gateway's first start (when it makes the demo
// account): a reload applies them to nothing, so it says so.
func (c *Config) firstStartOnlyDiff(old *Config) []string {
	if old == nil || c.Server.DemoCreditUSD == old.Server.DemoCreditUSD {
		return nil
	}
	return []string{"server.demo_credit_usd"}
}
