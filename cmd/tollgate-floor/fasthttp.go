package main

import (
	"bufio"
	"net"

	"github.com/valyala/fasthttp"
)

// serveFasthttp relays with fasthttp alone. A response of known length is
// passed on whole; any other (a chunked stream) read by read, each flushed.
func serveFasthttp(ln net.Listener, upstream string) error {
	hc := &fasthttp.HostClient{Addr: upstream, MaxConns: 1 << 16, StreamResponseBody: true}
	s := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { relay(ctx, hc) }}
	return s.Serve(ln)
}

func relay(ctx *fasthttp.RequestCtx, hc *fasthttp.HostClient) {
	resp := &fasthttp.Response{}
	if err := hc.Do(&ctx.Request, resp); err != nil {
		ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		return
	}
	resp.Header.CopyTo(&ctx.Response.Header)
	body := resp.BodyStream()
	if body == nil {
		ctx.SetBody(resp.Body())
		return
	}
	if n := resp.Header.ContentLength(); n >= 0 {
		ctx.SetBodyStream(closingReader{resp}, n)
		return
	}
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer resp.CloseBodyStream()
		buf := make([]byte, 16<<10)
		for {
			n, err := body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil || w.Flush() != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}

// closingReader hands the upstream connection back once the body was read.
type closingReader struct{ resp *fasthttp.Response }

func (r closingReader) Read(p []byte) (int, error) { return r.resp.BodyStream().Read(p) }
func (r closingReader) Close() error               { return r.resp.CloseBodyStream() }
