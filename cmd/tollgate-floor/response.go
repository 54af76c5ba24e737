package main

import (
	"bytes"
	"fmt"
	"iter"
	"strconv"
)

// responseEnd follows an HTTP/1.1 response as its bytes pass, to know
// where it ends: after Content-Length bytes, after the last chunk of a
// chunked body, or (neither given) when the upstream closes.
type responseEnd struct {
	head       []byte // the head, until it is whole
	inBody     bool
	chunked    bool
	close      bool  // the upstream closes after this response
	remaining  int64 // body bytes, or the current chunk's data bytes, to come
	chunkState chunkState
	line       []byte // the chunk size or trailer line read so far
}

// reset readies r for the next response, keeping its buffers.
func (r *responseEnd) reset() {
	*r = responseEnd{head: r.head[:0], line: r.line[:0]}
}

type chunkState int

const (
	chunkSize chunkState = iota
	chunkData
	chunkDataEnd
	chunkTrailer
)

// feed takes the next bytes of the response and reports whether it ended
// with them. Bytes past the end are an error: upstreams do not pipeline.
func (r *responseEnd) feed(p []byte) (bool, error) {
	if !r.inBody {
		r.head = append(r.head, p...)
		end := bytes.Index(r.head, []byte("\r\n\r\n"))
		if end < 0 {
			return false, nil
		}
		if err := r.parseHead(r.head[:end]); err != nil {
			return false, err
		}
		p = r.head[end+4:]
		r.inBody = true
		if !r.chunked && r.remaining == 0 {
			return len(p) == 0, extra(p)
		}
	}
	if !r.chunked {
		if r.remaining < 0 {
			return false, nil // ends when the upstream closes
		}
		if int64(len(p)) > r.remaining {
			return false, extra(p[r.remaining:])
		}
		r.remaining -= int64(len(p))
		return r.remaining == 0, nil
	}
	return r.feedChunked(p)
}

func (r *responseEnd) parseHead(head []byte) error {
	statusLine, _, _ := bytes.Cut(head, crlf)
	status := bytes.Fields(statusLine)
	if len(status) < 2 {
		return fmt.Errorf("status line %q", statusLine)
	}
	code, err := strconv.Atoi(string(status[1]))
	if err != nil {
		return fmt.Errorf("status line %q", statusLine)
	}
	r.remaining = -1
	if code == 204 || code == 304 || code < 200 {
		r.remaining = 0
	}
	for name, value := range headerFields(head) {
		switch {
		case bytes.EqualFold(name, []byte("content-length")) && r.remaining != 0:
			if r.remaining, err = contentLength(value); err != nil {
				return err
			}
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			r.chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("connection")):
			r.close = bytes.EqualFold(value, []byte("close"))
		}
	}
	if r.remaining < 0 && !r.chunked {
		r.close = true
	}
	return nil
}

var crlf = []byte("\r\n")

// headerFields yields the name and trimmed value of each header line of
// a message head (its first line, the request or status line, skipped),
// without allocating.
func headerFields(head []byte) iter.Seq2[[]byte, []byte] {
	return func(yield func(name, value []byte) bool) {
		_, rest, _ := bytes.Cut(head, crlf)
		for len(rest) > 0 {
			var line []byte
			line, rest, _ = bytes.Cut(rest, crlf)
			name, value, _ := bytes.Cut(line, []byte(":"))
			if !yield(name, bytes.TrimSpace(value)) {
				return
			}
		}
	}
}

// contentLength parses a Content-Length value.
func contentLength(value []byte) (int64, error) {
	n, err := strconv.ParseInt(string(value), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("Content-Length %q", value)
	}
	return n, nil
}

func (r *responseEnd) feedChunked(p []byte) (bool, error) {
	for len(p) > 0 {
		if r.chunkState == chunkData {
			n := min(int64(len(p)), r.remaining)
			r.remaining -= n
			p = p[n:]
			if r.remaining == 0 {
				r.chunkState = chunkDataEnd
			}
			continue
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.line = append(r.line, p...)
			return false, nil
		}
		line := bytes.TrimRight(append(r.line, p[:i]...), "\r")
		r.line, p = r.line[:0], p[i+1:]
		switch r.chunkState {
		case chunkDataEnd:
			if len(line) != 0 {
				return false, fmt.Errorf("chunk data runs past its size")
			}
			r.chunkState = chunkSize
		case chunkSize:
			hex, _, _ := bytes.Cut(line, []byte(";"))
			n, err := strconv.ParseInt(string(bytes.TrimSpace(hex)), 16, 64)
			if err != nil || n < 0 {
				return false, fmt.Errorf("chunk size %q", line)
			}
			if n == 0 {
				r.chunkState = chunkTrailer
			} else {
				r.remaining, r.chunkState = n, chunkData
			}
		case chunkTrailer:
			if len(line) == 0 {
				return len(p) == 0, extra(p)
			}
		}
	}
	return false, nil
}

func extra(p []byte) error {
	if len(p) > 0 {
		return fmt.Errorf("%d bytes past the end of the response", len(p))
	}
	return nil
}
