package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/classifiers"
)

// benchRequests are every classify (with descriptions and examples, labels
// as given), score and match call of the parts, built before the engine so
// that the memory they take is not counted as the engine's.
type benchRequests struct {
	classify []classifiers.ClassifyRequest
	score    []classifiers.ScoreRequest
	match    []classifiers.MatchRequest
}

func collectRequests(ps []*part) benchRequests {
	var r benchRequests
	for _, p := range ps {
		for _, it := range p.classify {
			ls := p.sets[it.Set]
			r.classify = append(r.classify, classifiers.ClassifyRequest{Text: it.Text, Labels: it.Labels,
				Descriptions: ls.Descriptions, Examples: ls.Examples, Mode: classifiers.ModeSingle})
		}
		seen := map[scoreKey]bool{}
		for _, sp := range p.pairs {
			for _, text := range []string{sp.Higher, sp.Lower} {
				k := scoreKey{sp.Attribute, sp.Description, text}
				if !seen[k] {
					seen[k] = true
					r.score = append(r.score, classifiers.ScoreRequest{Source: text, Attribute: sp.Attribute, Description: sp.Description})
				}
			}
		}
		for _, mp := range p.match {
			for _, q := range mp.Queries {
				for _, d := range mp.Docs {
					r.match = append(r.match, classifiers.MatchRequest{Source: d, Query: q.Query})
				}
			}
		}
	}
	return r
}

type benchOp struct {
	name  string
	calls []func()
}

func (r benchRequests) ops(engine classifiers.Engine) []benchOp {
	ctx := context.Background()
	var classify, score, match []func()
	for _, req := range r.classify {
		classify = append(classify, func() { _, _ = engine.Classify(ctx, req) })
	}
	for _, req := range r.score {
		score = append(score, func() { _, _ = engine.Score(ctx, req) })
	}
	for _, req := range r.match {
		match = append(match, func() { _, _ = engine.Match(ctx, req) })
	}
	return []benchOp{{"classify", classify}, {"score", score}, {"match", match}}
}

// runBench reports the resident memory the engine adds (VmRSS after
// starting it and one warm-up pass over every call, minus before starting
// it, with freed heap returned to the system both times), then times every
// call, rounds times over, on one goroutine (latency percentiles) and on
// GOMAXPROCS goroutines (throughput).
func runBench(w io.Writer, name string, newEngine func() (classifiers.Engine, error), ps []*part, rounds int) error {
	reqs := collectRequests(ps)
	debug.FreeOSMemory()
	before, err := vmRSS()
	if err != nil {
		return err
	}
	engine, err := newEngine()
	if err != nil {
		return fmt.Errorf("starting the %s engine: %w", name, err)
	}
	ops := reqs.ops(engine)
	for _, o := range ops {
		for _, c := range o.calls {
			c()
		}
	}
	debug.FreeOSMemory()
	after, err := vmRSS()
	if err != nil {
		return err
	}
	procs := runtime.GOMAXPROCS(0)
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.name
	}
	fmt.Fprintf(w, "%s engine, %s texts, %d passes; %d cores\n", name, strings.Join(names, "+"), rounds, runtime.NumCPU())
	added := float64(after-before) / (1 << 20)
	fmt.Fprintf(w, "RSS added by the engine, loaded and warmed: %.1f MiB (VmRSS %.1f -> %.1f MiB)\n",
		added, float64(before)/(1<<20), float64(after)/(1<<20))
	fmt.Fprintf(w, "%-10s %9s %10s %10s %14s %14s\n", "operation", "calls", "p50 µs", "p99 µs", "calls/s (1)", fmt.Sprintf("calls/s (%d)", procs))
	var worst time.Duration
	worstOp := ""
	for _, o := range ops {
		p50, p99, serial := timeSerial(o.calls, rounds)
		parallel := timeParallel(o.calls, rounds, procs)
		fmt.Fprintf(w, "%-10s %9d %10.1f %10.1f %14.0f %14.0f\n", o.name, rounds*len(o.calls), micros(p50), micros(p99), serial, parallel)
		if p99 > worst {
			worst, worstOp = p99, o.name
		}
	}
	fmt.Fprintf(w, "goals: p99 per call at most 2 ms: %s (worst %.0f µs, %s); RSS the engine adds, vectors and all, at most 64 MiB: %s (%.1f MiB)\n",
		metOrNot(worst <= 2*time.Millisecond), micros(worst), worstOp, metOrNot(added <= 64), added)
	return nil
}

func timeSerial(calls []func(), rounds int) (p50, p99 time.Duration, perSecond float64) {
	lat := make([]time.Duration, 0, rounds*len(calls))
	start := time.Now()
	for range rounds {
		for _, c := range calls {
			t0 := time.Now()
			c()
			lat = append(lat, time.Since(t0))
		}
	}
	perSecond = float64(len(lat)) / time.Since(start).Seconds()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[len(lat)*99/100], perSecond
}

func timeParallel(calls []func(), rounds, procs int) float64 {
	var wg sync.WaitGroup
	start := time.Now()
	for range procs {
		wg.Go(func() {
			for range rounds {
				for _, c := range calls {
					c()
				}
			}
		})
	}
	wg.Wait()
	return float64(procs*rounds*len(calls)) / time.Since(start).Seconds()
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// vmRSS is this process's resident set in bytes, from /proc/self/status.
func vmRSS() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("reading resident memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("reading resident memory: VmRSS %q: %w", rest, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("reading resident memory: no VmRSS in /proc/self/status")
}
