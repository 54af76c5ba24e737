package proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

func scrape(t *testing.T, h *harness) string {
	t.Helper()
	resp, err := h.client.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := string(readAll(t, resp))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
	}
	return body
}

func TestMetricsCountCallsLatencyAndTokens(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin\n  eject_after: 100", proxytest.Options{PromptTokens: 7, CompletionTokens: 5}, proxytest.Options{Status: 500})
	for range 6 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	for range 2 {
		readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	}
	body := scrape(t, h.harness)
	labels := func(upstream, status string) string {
		return `{model="small",upstream="` + upstream + `",endpoint="/v1/chat/completions",status="` + status + `"}`
	}
	for _, want := range []string{
		"tollgate_requests_total" + labels("p0", "200") + " 4",
		"tollgate_requests_total" + labels("p1", "500") + " 4",
		`tollgate_request_duration_seconds_bucket{model="small",upstream="p0",endpoint="/v1/chat/completions",status="200",le="+Inf"} 4`,
		`tollgate_time_to_first_token_seconds_count{model="small",upstream="p0",endpoint="/v1/chat/completions",status="200"} 4`,
		`tollgate_tokens_total{model="small",upstream="p0",endpoint="/v1/chat/completions",status="200",kind="prompt"} 28`,
		`tollgate_tokens_total{model="small",upstream="p0",endpoint="/v1/chat/completions",status="200",kind="completion"} 20`,
		`tollgate_upstream_calls_total{upstream="p1"} 4`,
		`tollgate_upstream_in_flight{upstream="p0"} 0`,
		"# TYPE tollgate_request_duration_seconds histogram",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// An error status has no time to first token nor tokens: such series
	// would stay 0 for ever.
	if strings.Contains(body, "tollgate_time_to_first_token_seconds_count"+labels("p1", "500")) ||
		strings.Contains(body, `tollgate_tokens_total{model="small",upstream="p1",endpoint="/v1/chat/completions",status="500",kind="prompt"}`) {
		t.Errorf("/metrics has first-token or token series for status 500")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// A stream the upstream cut after its first byte is counted as
// interrupted, beside its 200 (the status the client got).
func TestMetricsCountInterruptedStreams(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 10, DropAfter: 3}})
	for range 2 {
		readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	}
	body := scrape(t, h)
	if want := `tollgate_requests_interrupted_total{model="small",upstream="local",endpoint="/v1/chat/completions",status="200"} 2`; !strings.Contains(body, want+"\n") {
		t.Fatalf("/metrics lacks %s:\n%s", want, body)
	}
}

// TestGrafanaDashboardUsesServedMetrics keeps deploy/grafana/tollgate.json
// honest: every metric it queries is one the gateway serves (the metering
// series come from cmd/tollgate/metrics.go).
func TestGrafanaDashboardUsesServedMetrics(t *testing.T) {
	h := newPoolHarness(t, 1, "  balance: p2c")
	readAll(t, h.post("/v1/chat/completions", smallChat))
	served := map[string]bool{}
	meterSrc := readFile(t, "../cmd/tollgate/metrics.go")
	for _, text := range []string{scrape(t, h.harness), meterSrc} {
		for _, m := range regexp.MustCompile(`# TYPE (tollgate_\w+)`).FindAllStringSubmatch(text, -1) {
			served[m[1]] = true
		}
	}
	dash := readFile(t, "../deploy/grafana/tollgate.json")
	used := regexp.MustCompile(`tollgate_[a-z_]+`).FindAllString(dash, -1)
	if len(used) < 10 {
		t.Fatalf("dashboard queries only %d metrics", len(used))
	}
	for _, name := range used {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if !served[base] {
			t.Errorf("dashboard queries %s, which /metrics does not serve", name)
		}
	}
}

// refusedCount is tollgate_requests_refused_total of endpoint and
// status in a /metrics body, 0 when absent.
func refusedCount(body, endpoint, status string) int {
	re := regexp.MustCompile(`tollgate_requests_refused_total\{endpoint="` + regexp.QuoteMeta(endpoint) + `",status="` + status + `"\} (\d+)`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Requests the gateway refuses itself (no key, a body too large) are
// counted by endpoint and status; a path of the client's own invention
// counts as "other", so it cannot make up label values.
func TestMetricsCountRefusals(t *testing.T) {
	proxy.SetRequestReadTimeout(t, 300*time.Millisecond)
	h := newHarness(t, harnessOptions{})
	count := refusedCount
	before := scrape(t, h)
	readAll(t, h.post("/v1/chat/completions", smallChat, "tg-forged"))
	readAll(t, h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"`+strings.Repeat("x", 70<<10)+`"}]}`))
	readAll(t, h.post("/v1/made-up/"+strings.Repeat("a", 20), "{}"))
	// Told 413 before the upload, by fasthttp's Expect handler.
	readStatus(t, rawRequest(t, h.url, "POST /v1/responses HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n", ""))
	// A body announced and never sent whole: 408, as a slow client gets
	// it (until 2026-11-26 it counted under status="4xx"); one stopped in
	// its first 8 KiB, which fasthttp reads and drops with the request
	// line, counts as "other". A compressed body: 415.
	readStatus(t, rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+h.key+"\r\nContent-Length: 50000\r\n\r\n", `{"model":"small","input":"`+strings.Repeat("x", 20_000)))
	readStatus(t, rawRequest(t, h.url, "POST /v1/classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+h.key+"\r\nContent-Length: 1000\r\n\r\n", "{"))
	readStatus(t, rawRequest(t, h.url, "POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+h.key+"\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n", "{}"))
	after := scrape(t, h)
	for _, c := range []struct{ endpoint, status string }{
		{"/v1/chat/completions", "401"}, {"/v1/chat/completions", "413"}, {"other", "404"}, {"/v1/responses", "413"},
		{"/v1/chat/completions", "408"}, {"other", "408"}, {"/v1/responses", "415"},
	} {
		if got := count(after, c.endpoint, c.status) - count(before, c.endpoint, c.status); got != 1 {
			t.Errorf("refused %s %s counted %d times, want 1", c.endpoint, c.status, got)
		}
	}
	if strings.Contains(after, "made-up") {
		t.Errorf("a client's path became a label value")
	}
}

// A path that only begins with an endpoint's was counted under it:
// GET /v1/chat/completionsXYZ, /v1/tagging, /adminx, routes that do not
// exist, were refusals of /v1/chat/completions, /v1/tag and /admin. They
// are "other"; a path below an endpoint's (/v1/models/{id},
// /admin/v1/…) is still that endpoint's.
func TestMetricsCountRefusalsOfLookalikePathsAsOther(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	count := refusedCount
	before := scrape(t, h)
	lookalikes := []string{"/v1/chat/completionsXYZ", "/v1/tagging", "/v1/batchy", "/adminx", "/consoleZZ", "/v1/modelsx"}
	for _, path := range lookalikes {
		resp := h.get("GET", path, "")
		if body := readAll(t, resp); resp.StatusCode != 404 {
			t.Fatalf("GET %s: %d %s, want 404", path, resp.StatusCode, body)
		}
	}
	readAll(t, h.get("GET", "/v1/models/no-such-model", ""))
	after := scrape(t, h)
	for _, c := range []struct {
		endpoint string
		want     int
	}{
		{"other", len(lookalikes)}, {"/v1/chat/completions", 0}, {"/v1/tag", 0}, {"/v1/batch", 0},
		{"/admin", 0}, {"/console", 0}, {"/v1/models", 1},
	} {
		if got := count(after, c.endpoint, "404") - count(before, c.endpoint, "404"); got != c.want {
			t.Errorf("404s counted under %s: %d, want %d", c.endpoint, got, c.want)
		}
	}
}

// A connection past the client connection cap is answered 503 by fasthttp
// before any request is read, so it was in no series: an operator saw the
// clients' retries and nothing else. It is counted, beside the cap.
func TestMetricsCountConnectionsRefusedAtTheCap(t *testing.T) {
	const limit = 4
	proxy.SetClientConnectionCap(t, limit)
	h := newHarness(t, harnessOptions{})
	addr := strings.TrimPrefix(h.url, "http://")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	for range limit + 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		answer, err := io.ReadAll(c)
		if err == nil || len(answer) > 0 {
			if !strings.Contains(string(answer), " 503 ") {
				t.Fatalf("a connection past the cap was answered %q", answer)
			}
			refused++
			c.Close()
			break
		}
		held = append(held, c) // served: the server waits for its request
	}
	if refused != 1 {
		t.Fatalf("no connection of %d was refused under a cap of %d", len(held), limit)
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	var body string
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp, err := h.client.Get(h.url + "/metrics")
		if err != nil {
			return err
		}
		body = string(readAll(t, resp))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/metrics: %d", resp.StatusCode)
		}
		return nil
	})
	// The scrapes that came before the server saw the held connections
	// closed were refused too, and counted.
	m := regexp.MustCompile(`\ntollgate_client_connections_refused_total (\d+)\n`).FindStringSubmatch(body)
	if m == nil || m[1] == "0" {
		t.Errorf("refused connections not counted: %v\n%s", m, body)
	}
	for _, want := range []string{
		"tollgate_client_connections_cap 4\n",
		"# TYPE tollgate_client_connections gauge\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
}

// callSeriesNaming returns the lines of the per-call series (requests,
// durations, tokens) in a /metrics body whose labels hold label.
func callSeriesNaming(body, label string) []string {
	var lines []string
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "tollgate_upstream_") && !strings.HasPrefix(line, "#") && strings.Contains(line, label) {
			lines = append(lines, line)
		}
	}
	return lines
}

// The series of an upstream a reload took out of a model's pool, or out
// of the config, are dropped; those of the members kept keep counting.
// They were kept for ever: renaming a pool's 4 upstreams added 168
// lines to /metrics at every reload, and a big config replaced by a small
// one kept its 70 MB of series until a restart.
func TestMetricsDropSeriesOfUpstreamsAReloadRemoved(t *testing.T) {
	const routing = "  balance: round_robin"
	h := newPoolHarness(t, 3, routing)
	for range 6 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	body := scrape(t, h.harness)
	for _, up := range []string{"p0", "p1", "p2"} {
		if want := `tollgate_requests_total{model="small",upstream="` + up + `",endpoint="/v1/chat/completions",status="200"} 2`; !strings.Contains(body, want+"\n") {
			t.Fatalf("/metrics lacks %s:\n%s", want, body)
		}
	}

	h.setPool(routing, "p0", "p1") // p2 stays in upstreams, out of the pool
	body = scrape(t, h.harness)
	if lines := callSeriesNaming(body, `upstream="p2"`); len(lines) > 0 {
		t.Errorf("p2 left the pool of small, and /metrics still has %d series of it, such as %s", len(lines), lines[0])
	}
	if want := `tollgate_requests_total{model="small",upstream="p0",endpoint="/v1/chat/completions",status="200"} 2`; !strings.Contains(body, want+"\n") {
		t.Errorf("/metrics lost the series of p0, still in the pool: lacks %s", want)
	}

	h.ups = h.ups[:1]
	h.setPool(routing, "p0") // p1 and p2 are no longer upstreams at all
	readAll(t, h.post("/v1/chat/completions", smallChat))
	body = scrape(t, h.harness)
	for _, up := range []string{"p1", "p2"} {
		if lines := callSeriesNaming(body, `upstream="`+up+`"`); len(lines) > 0 {
			t.Errorf("%s was removed from the config, and /metrics still has %d series of it, such as %s", up, len(lines), lines[0])
		}
	}
	if want := `tollgate_requests_total{model="small",upstream="p0",endpoint="/v1/chat/completions",status="200"} 3`; !strings.Contains(body, want+"\n") {
		t.Errorf("/metrics lacks %s", want)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// The series of a model a reload removed are dropped, those of the
// models kept are not.
func TestMetricsDropSeriesOfModelsAReloadRemoved(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	readAll(t, h.post("/v1/chat/completions", smallChat))
	readAll(t, h.post("/v1/chat/completions", `{"model":"large","messages":[{"role":"user","content":"hi"}]}`))
	if lines := callSeriesNaming(scrape(t, h), `model="large"`); len(lines) == 0 {
		t.Fatal("/metrics has no series of model large after a call to it")
	}

	cfg := readFile(t, h.cfgPath)
	h.writeConfig(cfg[:strings.Index(cfg, "  - id: large")])
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		resp, err := h.client.Get(h.url + "/v1/models")
		if err != nil {
			return err
		}
		if body := string(readAll(t, resp)); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"small"`) || strings.Contains(body, `"large"`) {
			return fmt.Errorf("the config without model large is not in force yet: %d %s", resp.StatusCode, body)
		}
		return nil
	})
	body := scrape(t, h)
	if lines := callSeriesNaming(body, `model="large"`); len(lines) > 0 {
		t.Errorf("model large was removed, and /metrics still has %d series of it, such as %s", len(lines), lines[0])
	}
	if want := `tollgate_requests_total{model="small",upstream="local",endpoint="/v1/chat/completions",status="200"} 1`; !strings.Contains(body, want+"\n") {
		t.Errorf("/metrics lost the series of model small: lacks %s", want)
	}
}

// Renaming a pool's upstreams under load, scraped all along, leaves the
// series of the names in force only, once a reload follows the calls
// that ran on the names before: the probe's churn grew /metrics by 42
// lines per upstream and status at every rename.
func TestMetricsStayBoundedWhileUpstreamsAreRenamedUnderLoad(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	names := []string{"p0", "p1"}
	rename := func(round int) {
		t.Helper()
		cfg := readFile(t, h.cfgPath)
		renamed := []string{fmt.Sprintf("gpu-%d-a", round), fmt.Sprintf("gpu-%d-b", round)}
		for i, name := range names {
			cfg = strings.Replace(cfg, "name: "+name+",", "name: "+renamed[i]+",", 1)
		}
		cfg = strings.Replace(cfg, "upstreams: ["+strings.Join(names, ", ")+"]", "upstreams: ["+strings.Join(renamed, ", ")+"]", 1)
		h.writeConfig(cfg)
		names = renamed
		checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
			got := h.statuses()
			for _, name := range names {
				if _, ok := got[name]; !ok {
					return fmt.Errorf("renamed pool not in force yet: %v", got)
				}
			}
			return nil
		})
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls atomic.Int64
	load := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				f()
			}
		}()
	}
	for range 2 {
		load(func() {
			req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(smallChat))
			req.Header.Set("Authorization", "Bearer "+h.key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := h.client.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					calls.Add(1)
				}
			}
		})
	}
	load(func() {
		if resp, err := h.client.Get(h.url + "/metrics"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	for round := 1; round <= 4; round++ {
		from := calls.Load()
		checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
			if n := calls.Load() - from; n < 10 {
				return fmt.Errorf("%d calls answered since the reload", n)
			}
			return nil
		})
		rename(round)
	}
	close(stop)
	wg.Wait()
	rename(5) // drops what calls in flight at the last rename counted after it
	readAll(t, h.post("/v1/chat/completions", smallChat))

	body := scrape(t, h.harness)
	for _, line := range callSeriesNaming(body, `upstream="`) {
		if !strings.Contains(line, `upstream="gpu-5-`) && !strings.Contains(line, `upstream=""`) {
			t.Fatalf("after the renames /metrics still has %s", line)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^tollgate_requests_total\{model="small",upstream="gpu-5-[ab]",endpoint="/v1/chat/completions",status="200"\} 1$`).FindAllString(body, -1)); n != 1 {
		t.Fatalf("/metrics counts the call after the last rename in %d series, want 1:\n%s", n, body)
	}
}
