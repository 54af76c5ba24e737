package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// The one model and usage every load request has, so each call's cost is
// known: tokens from the fake upstream, price from gateway.yaml.
const (
	loadModel            = "qwen2.5-14b-instruct-1m"
	loadPromptTokens     = 13
	loadCompletionTokens = 29
	loadChunks           = 8
)

// startUpstream runs the fake upstream every gateway of a test forwards to:
// fixed usage, and a few milliseconds between stream events so that a kill
// finds streams half sent.
func startUpstream(t *testing.T) *proxytest.Server {
	t.Helper()
	up := proxytest.NewServer(proxytest.Options{
		Chunks:           loadChunks,
		ChunkDelay:       2 * time.Millisecond,
		PromptTokens:     loadPromptTokens,
		CompletionTokens: loadCompletionTokens,
		NoRecord:         true,
	})
	t.Cleanup(up.Close)
	return up
}

// callCost is what one load call costs, computed with the catalog from the
// prices in the config file at path.
func callCost(t *testing.T, path string) money.Nanos {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("loading %s: %v", path, err)
	}
	cat, err := catalog.New(cfg.Models)
	if err != nil {
		t.Fatal(err)
	}
	entry, ok := cat.Resolve(loadModel)
	if !ok {
		t.Fatalf("%s has no model %s", path, loadModel)
	}
	cost := entry.Prices.Cost(catalog.Usage{PromptTokens: loadPromptTokens, CompletionTokens: loadCompletionTokens})
	if cost <= 0 {
		t.Fatalf("model %s costs %s USD per load call; the test needs a price", loadModel, cost)
	}
	return cost
}

// loadResult is what the clients saw.
type loadResult struct {
	mu sync.Mutex
	// completed holds the x-request-id of every answer a client received
	// whole: status 200 and, for streams, a body ending in data: [DONE].
	completed map[string]bool
	failed    int
	reasons   map[string]int // failure reason -> count, for the log
}

func (r *loadResult) ok(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.completed[id] {
		return false
	}
	r.completed[id] = true
	return true
}

func (r *loadResult) fail(err error) {
	reason := err.Error()
	// Addresses and ports make every transport error unique; keep the kind
	// (connection refused, reset by peer, EOF).
	var uerr *url.Error
	if errors.As(err, &uerr) {
		reason = uerr.Err.Error()
		if i := strings.LastIndex(reason, ": "); i >= 0 {
			reason = reason[i+2:]
		}
	}
	if len(reason) > 160 {
		reason = reason[:160] + "…"
	}
	r.mu.Lock()
	r.failed++
	r.reasons[reason]++
	r.mu.Unlock()
}

func (r *loadResult) counts() (completed, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.completed), r.failed
}

func (r *loadResult) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	reasons := make([]string, 0, len(r.reasons))
	for reason, n := range r.reasons {
		reasons = append(reasons, fmt.Sprintf("%d× %s", n, reason))
	}
	sort.Strings(reasons)
	s := fmt.Sprintf("%d completed, %d failed", len(r.completed), r.failed)
	if len(reasons) > 0 {
		s += " (" + strings.Join(reasons, "; ") + ")"
	}
	return s
}

// load is clients sending chat completions, streamed and not, in a loop.
type load struct {
	t      *testing.T
	res    *loadResult
	stop   chan struct{}
	wg     sync.WaitGroup
	client *http.Client
}

// newLoad returns clients that have sent nothing yet.
func newLoad(t *testing.T) *load {
	return &load{
		t:    t,
		res:  &loadResult{completed: map[string]bool{}, reasons: map[string]int{}},
		stop: make(chan struct{}),
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 16,
			DisableCompression:  true,
		}},
	}
}

// startLoad starts workersPer clients per target, each sending up to
// maxPerWorker requests with key, alternating streamed and non-streamed.
// A restarted gateway keeps its address, so workers simply carry on.
func startLoad(t *testing.T, targets []*gateway, key string, workersPer, maxPerWorker int) *load {
	l := newLoad(t)
	l.start(targets, key, workersPer, maxPerWorker)
	return l
}

func (l *load) start(targets []*gateway, key string, workersPer, maxPerWorker int) {
	for _, g := range targets {
		for w := range workersPer {
			l.wg.Add(1)
			go l.worker(g, key, w, maxPerWorker)
		}
	}
}

func (l *load) worker(g *gateway, key string, w, max int) {
	defer l.wg.Done()
	for i := range max {
		select {
		case <-l.stop:
			return
		default:
		}
		stream := (i+w)%2 == 1
		id, err := chatOnce(l.client, g.url("/v1/chat/completions"), key, stream)
		if err != nil {
			l.res.fail(err)
			// A gateway that is down refuses at once; do not spin.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if !l.res.ok(id) {
			l.t.Errorf("%s answered two requests with x-request-id %s", g.name, id)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// completedAtLeast waits until n answers have completed.
func (l *load) completedAtLeast(n int, within time.Duration) {
	l.t.Helper()
	checkFor(l.t, within, 20*time.Millisecond, func() error {
		if done, failed := l.res.counts(); done < n {
			return fmt.Errorf("%d answers completed (%d failed), waiting for %d: %s", done, failed, n, l.res.summary())
		}
		return nil
	})
}

// finish stops the clients and waits for the requests in flight.
func (l *load) finish() *loadResult {
	close(l.stop)
	l.wg.Wait()
	l.client.CloseIdleConnections()
	return l.res
}

var doneEvent = []byte("data: [DONE]\n\n")

// chatOnce sends one chat completion and returns its x-request-id if the
// answer arrived whole: 200, and a stream ending in data: [DONE] or a
// JSON body with the upstream's usage.
func chatOnce(client *http.Client, url, key string, stream bool) (string, error) {
	body := `{"model":"` + loadModel + `","messages":[{"role":"user","content":"Hello"}]`
	if stream {
		body += `,"stream":true`
	}
	body += "}"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("reading the answer (stream %v): %w", stream, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %.200s", resp.StatusCode, data)
	}
	id := resp.Header.Get("x-request-id")
	if id == "" {
		return "", errors.New("a 200 answer without x-request-id")
	}
	if stream {
		if !bytes.HasSuffix(data, doneEvent) {
			return "", fmt.Errorf("stream ended without data: [DONE]: %.200q", data[max(0, len(data)-200):])
		}
		return id, nil
	}
	u := gjson.GetBytes(data, "usage")
	if u.Get("prompt_tokens").Int() != loadPromptTokens || u.Get("completion_tokens").Int() != loadCompletionTokens {
		return "", fmt.Errorf("non-stream answer with usage %s, want %d prompt and %d completion tokens", u.Raw, loadPromptTokens, loadCompletionTokens)
	}
	return id, nil
}

// chatStatus sends one non-streamed chat completion and returns the status.
func chatStatus(t *testing.T, g *gateway, key string) int {
	t.Helper()
	body := `{"model":"` + loadModel + `","messages":[{"role":"user","content":"Hello"}]}`
	req, err := http.NewRequest(http.MethodPost, g.url("/v1/chat/completions"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", g.name, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
