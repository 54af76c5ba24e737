package main

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy/proxytest"
)

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	cases := []struct {
		values []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 50, 0},
		{[]time.Duration{7}, 50, 7},
		{[]time.Duration{7}, 99, 7},
		{[]time.Duration{1, 2}, 50, 1},
		{[]time.Duration{1, 2, 3}, 50, 2},
		{[]time.Duration{1, 2, 3, 4}, 50, 2},
		{[]time.Duration{1, 2, 3, 4}, 99, 4},
		{hundred, 50, 50},
		{hundred, 99, 99},
		{hundred, 99.5, 100},
		{hundred, 100, 100},
		{hundred, 0, 1},
	}
	for _, c := range cases {
		if got := percentile(c.values, c.p); got != c.want {
			t.Errorf("percentile(%d values, %v) = %v, want %v", len(c.values), c.p, got, c.want)
		}
	}
}

func TestReadEvents(t *testing.T) {
	cases := []struct {
		name, body string
		events     int
		err        error
	}{
		{"chat", "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n", 3, nil},
		{"responses", "event: response.created\ndata: {\"type\":\"response.created\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\"}\n\n", 2, nil},
		{"responses without event lines", "data: {\"type\":\"response.completed\"}\n\n", 1, nil},
		{"cut", "data: {}\n\ndata: {}\n\n", 2, errNoEnd},
		// A fragment of an overlong line that starts like a data line is not one.
		{"long line", "data: " + strings.Repeat("x", 122) + "data: [DONE]\n\ndata: {}\n\n", 2, errNoEnd},
	}
	for _, c := range cases {
		br := bufio.NewReaderSize(strings.NewReader(c.body), 64)
		events, _, err := readEvents(br, time.Now())
		if events != c.events || !errors.Is(err, c.err) {
			t.Errorf("%s: %d events, %v; want %d, %v", c.name, events, err, c.events, c.err)
		}
	}
}

func TestRunAgainstFakeUpstream(t *testing.T) {
	up := proxytest.NewServer(proxytest.Options{Chunks: 5})
	defer up.Close()
	for _, c := range []struct {
		endpoint string
		stream   bool
		events   int64 // per request
	}{
		{"chat", false, 0},
		{"chat", true, 8},
		{"responses", true, 13},
		{"responses", false, 0},
	} {
		up.Reset()
		res := run(context.Background(), config{url: up.URL, key: "k1", model: "m1", endpoint: c.endpoint,
			stream: c.stream, concurrency: 4, requests: 40, timeout: 5 * time.Second})
		if res.Requests != 40 || res.Errors != 0 || res.Events != 40*c.events || res.RPS <= 0 || res.P99Ms < res.P50Ms {
			t.Errorf("%s stream=%v: %s", c.endpoint, c.stream, res)
		}
		if c.stream && res.TTFEP50Ms <= 0 {
			t.Errorf("%s stream: no time to first event: %s", c.endpoint, res)
		}
		reqs := up.Requests()
		if len(reqs) != 40 || reqs[0].Header.Get("Authorization") != "Bearer k1" ||
			!strings.Contains(string(reqs[0].Body), `"model":"m1"`) {
			t.Errorf("%s: upstream saw %d requests, first %+v", c.endpoint, len(reqs), reqs[0])
		}
	}
}

func TestRunCountsErrorsAndCutStreams(t *testing.T) {
	up := proxytest.NewServer(proxytest.Options{Status: http.StatusInternalServerError})
	defer up.Close()
	cfg := config{url: up.URL, model: "m", endpoint: "chat", stream: true, concurrency: 2, requests: 10, timeout: 5 * time.Second}
	res := run(context.Background(), cfg)
	if res.Requests != 10 || res.Errors != 10 || !strings.Contains(res.FirstError, "status 500") {
		t.Errorf("status 500: %s", res)
	}
	up.SetOptions(proxytest.Options{OmitDone: true})
	if res := run(context.Background(), cfg); res.Errors != 10 || !strings.Contains(res.FirstError, "without data: [DONE]") {
		t.Errorf("no [DONE]: %s", res)
	}
	up.SetOptions(proxytest.Options{DropAfter: 2})
	if res := run(context.Background(), cfg); res.Errors != 10 {
		t.Errorf("dropped streams: %s", res)
	}
}

// TestRunStopsAtDuration also checks the connection bound: the fake upstream
// never sees more requests at once than -c.
func TestRunStopsAtDuration(t *testing.T) {
	up := proxytest.NewServer(proxytest.Options{NoRecord: true, Chunks: 3, ChunkDelay: time.Millisecond})
	defer up.Close()
	maxActive := 0
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-done:
				return
			default:
				maxActive = max(maxActive, up.Active())
				time.Sleep(100 * time.Microsecond)
			}
		}
	}()
	start := time.Now()
	res := run(context.Background(), config{url: up.URL, model: "m", endpoint: "chat", stream: true,
		concurrency: 3, duration: 300 * time.Millisecond, timeout: 5 * time.Second})
	took := time.Since(start)
	close(done)
	<-sampled
	if took < 300*time.Millisecond || took > 3*time.Second || res.Requests == 0 || res.Errors != 0 {
		t.Errorf("took %v: %s", took, res)
	}
	if maxActive > 3 || maxActive == 0 {
		t.Errorf("upstream saw up to %d requests at once with -c 3", maxActive)
	}
}
