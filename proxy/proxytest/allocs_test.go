//go:build !race

package proxytest

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// discardWriter is a ResponseWriter that costs nothing, so AllocsPerRun sees
// only the handler's own allocations.
type discardWriter struct{ header http.Header }

func (d *discardWriter) Header() http.Header         { return d.header }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

func handlerAllocs(t *testing.T, o Options, path, body string) float64 {
	t.Helper()
	s := newServer(t, o)
	raw := []byte(body)
	rd := bytes.NewReader(raw)
	req := httptest.NewRequest(http.MethodPost, path, nil)
	req.Body = io.NopCloser(rd)
	w := &discardWriter{header: http.Header{}}
	return testing.AllocsPerRun(200, func() {
		rd.Reset(raw)
		s.ServeHTTP(w, req)
	})
}

// TestAllocationsDoNotGrowWithChunks pins the hot loop: events are copied
// from pre-rendered templates, so a 1000-word stream allocates no more than
// a 10-word one.
func TestAllocationsDoNotGrowWithChunks(t *testing.T) {
	const maxAllocs = 2
	cases := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{"/v1/chat/completions", `{"model":"m"}`},
		{"/v1/responses", `{"model":"m","stream":true}`},
		{"/v1/responses", `{"model":"m"}`},
	}
	for _, c := range cases {
		small := handlerAllocs(t, Options{Chunks: 10, NoRecord: true}, c.path, c.body)
		large := handlerAllocs(t, Options{Chunks: 1000, NoRecord: true}, c.path, c.body)
		if large > small || small > maxAllocs {
			t.Errorf("%s %s: %v allocs with 10 chunks, %v with 1000; want at most %d for both",
				c.path, c.body, small, large, maxAllocs)
		}
	}
}
