// Command tollgate-load sends small generation requests to an
// OpenAI-compatible endpoint (the gateway, or a fake upstream for a baseline)
// from a fixed number of keep-alive connections, for a fixed time or count,
// and prints one line of results: as text, or as JSON with -json so a bench
// script can compare runs.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type config struct {
	url, key, model, endpoint string
	stream                    bool
	concurrency               int
	duration                  time.Duration
	requests                  int // when > 0, stop after this many instead of after duration
	timeout                   time.Duration
}

// result is one run. Latencies are of successful requests only.
type result struct {
	Endpoint    string  `json:"endpoint"`
	Stream      bool    `json:"stream"`
	Concurrency int     `json:"concurrency"`
	Requests    int     `json:"requests"` // finished, successful or not
	Errors      int     `json:"errors"`
	Seconds     float64 `json:"seconds"`
	RPS         float64 `json:"rps"` // successful requests per second
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	TTFEP50Ms   float64 `json:"ttfe_p50_ms,omitempty"` // streams: time to the first event
	Events      int64   `json:"events,omitempty"`      // streams: data events read
	FirstError  string  `json:"first_error,omitempty"`
}

func main() {
	var cfg config
	var jsonOut bool
	flag.StringVar(&cfg.url, "url", "http://127.0.0.1:8080/v1", "base URL, including /v1")
	flag.StringVar(&cfg.key, "key", "", "bearer token sent as Authorization (optional)")
	flag.StringVar(&cfg.model, "model", "proxytest-small", "model of every request")
	flag.StringVar(&cfg.endpoint, "endpoint", "chat", "chat (/chat/completions) or responses (/responses)")
	flag.BoolVar(&cfg.stream, "stream", false, "request streamed answers and read every event")
	flag.IntVar(&cfg.concurrency, "c", 32, "concurrent requests, each on its own keep-alive connection")
	flag.DurationVar(&cfg.duration, "d", 10*time.Second, "how long to send requests (ignored with -n)")
	flag.IntVar(&cfg.requests, "n", 0, "send this many requests instead of running for -d")
	flag.DurationVar(&cfg.timeout, "timeout", 30*time.Second, "limit on one request, body included")
	flag.BoolVar(&jsonOut, "json", false, "print the result as one JSON object")
	flag.Parse()

	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-load:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	res := run(ctx, cfg)
	if jsonOut {
		_ = json.NewEncoder(os.Stdout).Encode(res)
	} else {
		fmt.Println(res.String())
	}
	if res.Requests == res.Errors {
		os.Exit(1)
	}
}

func (c *config) check() error {
	var errs []error
	if c.endpoint != "chat" && c.endpoint != "responses" {
		errs = append(errs, fmt.Errorf("-endpoint %q: use chat or responses", c.endpoint))
	}
	if c.concurrency < 1 {
		errs = append(errs, fmt.Errorf("-c %d: need at least 1", c.concurrency))
	}
	if c.requests < 0 {
		errs = append(errs, fmt.Errorf("-n %d: cannot be negative", c.requests))
	}
	if c.requests == 0 && c.duration <= 0 {
		errs = append(errs, errors.New("give a positive -d or -n"))
	}
	if c.timeout <= 0 {
		errs = append(errs, fmt.Errorf("-timeout %v: must be positive", c.timeout))
	}
	return errors.Join(errs...)
}

func (c *config) target() (url string, body []byte) {
	req := map[string]any{"model": c.model}
	if c.endpoint == "responses" {
		url = strings.TrimSuffix(c.url, "/") + "/responses"
		req["input"] = "hello"
	} else {
		url = strings.TrimSuffix(c.url, "/") + "/chat/completions"
		req["messages"] = []map[string]string{{"role": "user", "content": "hello"}}
	}
	if c.stream {
		req["stream"] = true
	}
	body, _ = json.Marshal(req) // strings, bools and maps of them always marshal
	return url, body
}

// workerStats is what one worker saw; merged after the run.
type workerStats struct {
	latencies  []time.Duration
	firstEvent []time.Duration
	errors     int
	events     int64
	firstError string
}

func run(ctx context.Context, cfg config) result {
	url, body := cfg.target()
	transport := &http.Transport{
		MaxConnsPerHost:     cfg.concurrency,
		MaxIdleConnsPerHost: cfg.concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: cfg.timeout}

	var budget atomic.Int64
	budget.Store(int64(cfg.requests))
	more := func(deadline time.Time) bool {
		if ctx.Err() != nil {
			return false
		}
		if cfg.requests > 0 {
			return budget.Add(-1) >= 0
		}
		return time.Now().Before(deadline)
	}

	stats := make([]workerStats, cfg.concurrency)
	start := time.Now()
	deadline := start.Add(cfg.duration)
	var wg sync.WaitGroup
	for i := range stats {
		wg.Go(func() {
			st := &stats[i]
			br := bufio.NewReaderSize(nil, 64<<10)
			for more(deadline) {
				one(ctx, client, cfg, url, body, br, st)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	res := result{Endpoint: cfg.endpoint, Stream: cfg.stream, Concurrency: cfg.concurrency, Seconds: elapsed.Seconds()}
	var latencies, firstEvents []time.Duration
	for _, st := range stats {
		latencies = append(latencies, st.latencies...)
		firstEvents = append(firstEvents, st.firstEvent...)
		res.Errors += st.errors
		res.Events += st.events
		if res.FirstError == "" {
			res.FirstError = st.firstError
		}
	}
	slices.Sort(latencies)
	slices.Sort(firstEvents)
	res.Requests = len(latencies) + res.Errors
	if elapsed > 0 {
		res.RPS = float64(len(latencies)) / elapsed.Seconds()
	}
	res.P50Ms = ms(percentile(latencies, 50))
	res.P99Ms = ms(percentile(latencies, 99))
	if cfg.stream {
		res.TTFEP50Ms = ms(percentile(firstEvents, 50))
	}
	return res
}

// one sends a request and reads its whole answer into st.
func one(ctx context.Context, client *http.Client, cfg config, url string, body []byte, br *bufio.Reader, st *workerStats) {
	fail := func(err error) {
		if ctx.Err() != nil {
			return // interrupted by the user: not the server's fault
		}
		st.errors++
		if st.firstError == "" {
			st.firstError = err.Error()
		}
	}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		fail(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.key != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.key)
	}
	resp, err := client.Do(req)
	if err != nil {
		fail(err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		fail(fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg)))
		return
	}
	if !cfg.stream {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			fail(fmt.Errorf("reading body: %w", err))
			return
		}
		st.latencies = append(st.latencies, time.Since(start))
		return
	}
	br.Reset(resp.Body)
	events, first, err := readEvents(br, start)
	st.events += int64(events)
	if err != nil {
		fail(err)
		return
	}
	st.latencies = append(st.latencies, time.Since(start))
	st.firstEvent = append(st.firstEvent, first)
}

var (
	errNoEnd = errors.New("stream ended without data: [DONE] or response.completed")

	dataPrefix = []byte("data:")
	doneData   = []byte("data: [DONE]")
	completed  = []byte(`"type":"response.completed"`)
	eventDone  = []byte("event: response.completed")
)

// readEvents reads an SSE body to its end, counting data lines. first is the
// time from start to the first one. A stream that ends without its final
// event (chat's [DONE], responses' response.completed) is an error: that is
// what a cut stream looks like to a client.
func readEvents(br *bufio.Reader, start time.Time) (events int, first time.Duration, err error) {
	ended := false
	midLine := false // the previous read stopped at a full buffer
	for {
		line, err := br.ReadSlice('\n')
		if !midLine && bytes.HasPrefix(line, eventDone) {
			ended = true
		}
		if !midLine && bytes.HasPrefix(line, dataPrefix) {
			if events == 0 {
				first = time.Since(start)
			}
			events++
			if bytes.HasPrefix(line, doneData) || bytes.Contains(line, completed) {
				ended = true
			}
		}
		midLine = errors.Is(err, bufio.ErrBufferFull)
		switch {
		case midLine:
		case errors.Is(err, io.EOF):
			if !ended {
				return events, first, errNoEnd
			}
			return events, first, nil
		case err != nil:
			return events, first, fmt.Errorf("reading stream: %w", err)
		}
	}
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value at least p% of the values are at
// or below. It returns 0 for no values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	exact := p * float64(n) / 100 // multiplied first: exact for whole p
	rank := int(exact)
	if float64(rank) < exact {
		rank++ // ceil
	}
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

func ms(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}

func (r result) String() string {
	var b strings.Builder
	mode := "non-stream"
	if r.Stream {
		mode = "stream"
	}
	fmt.Fprintf(&b, "%s %s c=%d: requests %d  errors %d  req/s %.1f  p50 %.2fms  p99 %.2fms",
		r.Endpoint, mode, r.Concurrency, r.Requests, r.Errors, r.RPS, r.P50Ms, r.P99Ms)
	if r.Stream {
		fmt.Fprintf(&b, "  ttfe-p50 %.2fms  events %d", r.TTFEP50Ms, r.Events)
	}
	fmt.Fprintf(&b, "  in %.2fs", r.Seconds)
	if r.FirstError != "" {
		fmt.Fprintf(&b, "  first error: %s", r.FirstError)
	}
	return b.String()
}
