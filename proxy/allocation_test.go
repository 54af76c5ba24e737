//go:build !race

package proxy

import (
	"strings"
	"testing"
)

func TestRewriteAllocatesNothing(t *testing.T) {
	for _, body := range [][]byte{
		[]byte(`{"model":"small","stream":true,"messages":[{"role":"user","content":"hello"}]}`),
		[]byte(`{"model":"small","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hello"}]}`),
	} {
		dst := make([]byte, 0, 4096)
		n := testing.AllocsPerRun(200, func() {
			f, _ := scanRequest(body)
			dst, _ = rewriteRequest(dst[:0], body, &f, `"Qwen/Qwen2.5-14B-Instruct-1M"`, true)
		})
		if n != 0 {
			t.Fatalf("%v allocations per rewrite of %s", n, body)
		}
	}
}

func TestSSEReaderAllocatesNothingPerEvent(t *testing.T) {
	src := strings.NewReader(streamBody)
	rd := newSSEReader(src, 4096, 0)
	for { // warm the buffers
		if _, err := rd.Next(); err != nil {
			break
		}
	}
	n := testing.AllocsPerRun(100, func() {
		src.Reset(streamBody)
		rd.reset(src)
		for {
			if _, err := rd.Next(); err != nil {
				break
			}
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per 22-event stream", n)
	}
}
