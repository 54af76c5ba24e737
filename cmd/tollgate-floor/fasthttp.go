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

// relay is fasthttp's idiom: a pooled response, released once its body
// has gone to the client (at once, or when the body stream is done).
func relay(ctx *fasthttp.RequestCtx, hc *fasthttp.HostClient) {
	resp := fasthttp.AcquireResponse()
	if err := hc.Do(&ctx.Request, resp); err != nil {
		fasthttp.ReleaseResponse(resp)
		ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		return
	}
	resp.Header.CopyTo(&ctx.Response.Header)
	body := resp.BodyStream()
	if body == nil {
		ctx.SetBody(resp.Body())
		fasthttp.ReleaseResponse(resp)
		return
	}
	if n := resp.Header.ContentLength(); n >= 0 {
		ctx.SetBodyStream(releasingReader{resp}, n)
		return
	}
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer releasingReader{resp}.Close()
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

// releasingReader reads a response's body stream; Close hands the
// upstream connection back and the response to its pool.
type releasingReader struct{ resp *fasthttp.Response }

func (r releasingReader) Read(p []byte) (int, error) { return r.resp.BodyStream().Read(p) }

func (r releasingReader) Close() error {
	err := r.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(r.resp)
	return err
}
