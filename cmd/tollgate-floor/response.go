package main

import (
	"bytes"
	"fmt"
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
	lines := bytes.Split(head, []byte("\r\n"))
	status := bytes.Fields(lines[0])
	if len(status) < 2 {
		return fmt.Errorf("status line %q", lines[0])
	}
	code, err := strconv.Atoi(string(status[1]))
	if err != nil {
		return fmt.Errorf("status line %q", lines[0])
	}
	r.remaining = -1
	if code == 204 || code == 304 || code < 200 {
		r.remaining = 0
	}
	for _, line := range lines[1:] {
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("content-length")) && r.remaining != 0:
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("Content-Length %q", value)
			}
			r.remaining = n
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
