package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// errEventTooLarge stops a stream whose single event outgrows the upstream's
// max_response_body; raise that limit if an upstream legitimately sends such
// events (a responses stream's response.completed carries the whole output).
var errEventTooLarge = errors.New("server-sent event larger than max_response_body")

// sseEvent is one server-sent event as received. Raw holds the exact bytes,
// including any blank lines before it and the blank line that ends it, so an
// untouched event is relayed byte for byte. The slices are only valid until
// the next call to sseReader.Next.
type sseEvent struct {
	Raw  []byte
	Data []byte // data field values joined by "\n"; nil when the event has none
	Name []byte // value of the event field, if any
	// Complete is false for a trailing event the stream ended inside of,
	// which a client would not dispatch.
	Complete bool
	// dataStart and dataEnd locate the only data line in Raw (terminator
	// included) so it can be replaced; both zero when there are several,
	// or when the line begins the stream with a byte order mark.
	dataStart, dataEnd int
	dataLines          int
	bom                bool // Raw begins the stream with a byte order mark
}

// sseReader splits a byte stream into events. Lines end with "\n" or
// "\r\n"; a lone "\r" terminator (allowed by the SSE spec, used by no
// OpenAI-compatible server) is not recognised.
//
// An sseReader MUST NOT be used from concurrently running goroutines.
type sseReader struct {
	br       *bufio.Reader
	maxEvent int
	started  bool // a line was read: a byte order mark is no longer the stream's first
	raw      []byte
	data     []byte
}

func newSSEReader(r io.Reader, bufSize, maxEvent int) *sseReader {
	return &sseReader{br: bufio.NewReaderSize(r, bufSize), maxEvent: maxEvent}
}

// reset points the reader at a new stream, keeping its buffers.
func (r *sseReader) reset(src io.Reader) {
	r.br.Reset(src)
	r.raw = r.raw[:0]
	r.data = r.data[:0]
	r.started = false
}

// readLine appends one line, terminator included, to r.raw and returns its
// start offset.
func (r *sseReader) readLine() (int, error) {
	start := len(r.raw)
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.raw = append(r.raw, chunk...)
		if err == bufio.ErrBufferFull {
			if r.maxEvent > 0 && len(r.raw) > r.maxEvent {
				return start, errEventTooLarge
			}
			continue
		}
		return start, err
	}
}

// eventBuffered reports whether the next event is already whole in the
// buffer, so that reading it cannot wait on the upstream.
func (r *sseReader) eventBuffered() bool {
	b, _ := r.br.Peek(r.br.Buffered())
	b = bytes.TrimLeft(b, "\r\n")
	return bytes.Contains(b, blankLF) || bytes.Contains(b, blankCRLF) || bytes.Contains(b, blankCR)
}

var (
	blankLF    = []byte("\n\n")
	blankCRLF  = []byte("\r\n\r\n")
	blankCR    = []byte("\r\r")
	fieldData  = []byte("data")
	fieldEvent = []byte("event")
	bom        = []byte("\uFEFF")
)

// Next returns the next event. At the end of the stream it returns io.EOF;
// bytes after the last complete event come first as an event with
// Complete false. Any other error is the underlying reader's.
func (r *sseReader) Next() (sseEvent, error) {
	r.raw = r.raw[:0]
	r.data = r.data[:0]
	ev := sseEvent{}
	fields := 0
	for {
		start, err := r.readLine()
		line := r.raw[start:]
		if err != nil {
			if len(r.raw) > 0 && (err == io.EOF) {
				if len(line) > 0 {
					r.field(&ev, start, len(r.raw), trimEOL(line))
				}
				ev.Raw = r.raw
				r.finish(&ev)
				return ev, nil
			}
			return sseEvent{}, err
		}
		content := trimEOL(line)
		if !r.started {
			// The SSE spec ignores one byte order mark at the start of
			// the stream; read as part of the field name, it hid the
			// first event's data.
			r.started = true
			if bytes.HasPrefix(content, bom) {
				content, ev.bom = content[len(bom):], true
			}
		}
		if len(content) == 0 {
			if fields == 0 {
				continue // blank lines before an event belong to its Raw
			}
			ev.Raw = r.raw
			ev.Complete = true
			r.finish(&ev)
			return ev, nil
		}
		fields++
		r.field(&ev, start, len(r.raw), content)
		if r.maxEvent > 0 && len(r.raw) > r.maxEvent {
			return sseEvent{}, errEventTooLarge
		}
	}
}

func (r *sseReader) finish(ev *sseEvent) {
	if ev.dataLines > 0 {
		ev.Data = r.data
	}
	if ev.dataLines != 1 || ev.bom {
		ev.dataStart, ev.dataEnd = 0, 0
	}
}

// field records one non-blank line located at r.raw[start:end].
func (r *sseReader) field(ev *sseEvent, start, end int, content []byte) {
	if content[0] == ':' {
		return // comment
	}
	name, value := content, []byte(nil)
	if i := bytes.IndexByte(content, ':'); i >= 0 {
		name, value = content[:i], content[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch {
	case bytes.Equal(name, fieldData):
		if ev.dataLines > 0 {
			r.data = append(r.data, '\n')
		}
		r.data = append(r.data, value...)
		ev.dataLines++
		ev.dataStart, ev.dataEnd = start, end
	case bytes.Equal(name, fieldEvent):
		ev.Name = value
	}
}

// dataPrefix is the start of a data line up to its value: "data:" and the
// space after it, if one came. Written as "data: " always, the lines of
// an upstream that sends none (vLLM's `data:{…}`, in some versions)
// gained one wherever the gateway rewrote an event.
func dataPrefix(line []byte) []byte {
	n := bytes.IndexByte(line, ':') + 1
	if n == 0 {
		return dataColon // "data" alone: an empty value (attempt.go's)
	}
	if n < len(line) && line[n] == ' ' {
		n++
	}
	return line[:n]
}

func trimEOL(line []byte) []byte {
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
	}
	return line
}

// appendWithDataLines appends ev to dst with its data replaced by data,
// for an event whose data came in several lines (or after a byte order
// mark): every other line stays as it came, and data, split at its
// newlines into lines again, each after the first data line's prefix,
// takes the place of the first data line.
func appendWithDataLines(dst []byte, ev *sseEvent, data []byte) []byte {
	raw, wrote := ev.Raw, false
	if ev.bom { // only ever the first bytes of a stream's first event
		dst = append(dst, bom...)
		raw = raw[len(bom):]
	}
	for len(raw) > 0 {
		n := bytes.IndexByte(raw, '\n') + 1
		if n == 0 {
			n = len(raw)
		}
		line := raw[:n]
		raw = raw[n:]
		content := trimEOL(line)
		name, _, _ := bytes.Cut(content, []byte{':'})
		if len(content) == 0 || !bytes.Equal(name, fieldData) {
			dst = append(dst, line...)
			continue
		}
		if wrote {
			continue
		}
		wrote = true
		term := line[len(content):]
		prefix := dataPrefix(content)
		for part := range bytes.SplitSeq(data, []byte{'\n'}) {
			dst = append(dst, prefix...)
			dst = append(dst, part...)
			dst = append(dst, term...)
		}
	}
	return dst
}

// appendWithData appends ev to dst with its single data line's value
// replaced by data, keeping every other byte as received.
func appendWithData(dst []byte, ev *sseEvent, data []byte) []byte {
	dst = append(dst, ev.Raw[:ev.dataStart]...)
	dst = append(dst, dataPrefix(ev.Raw[ev.dataStart:ev.dataEnd])...)
	dst = append(dst, data...)
	// keep the line terminator the upstream used
	term := ev.Raw[ev.dataStart:ev.dataEnd]
	switch {
	case bytes.HasSuffix(term, []byte("\r\n")):
		dst = append(dst, '\r', '\n')
	case bytes.HasSuffix(term, []byte("\n")):
		dst = append(dst, '\n')
	}
	return append(dst, ev.Raw[ev.dataEnd:]...)
}
