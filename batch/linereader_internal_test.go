package batch

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The input's byte order mark is not part of its first line; a mark
// further on is left as it is (it is not a mark there).
func TestLineReaderDropsTheInputsByteOrderMark(t *testing.T) {
	lr := newLineReader(strings.NewReader("\ufeff{\"text\": \"a\"}\r\n{\"text\": \"b\"}\n\ufeffc"), 0, 1024)
	var got []string
	for {
		line, _, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(line))
	}
	want := []string{`{"text": "a"}`, `{"text": "b"}`, "\ufeffc"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("lines %q, want %q", got, want)
	}
}

// A passing fault's retries back off, so ten of them span about twenty
// minutes, not the three minutes of a fixed 5 s in which an object store
// outage failed the job.
func TestFaultBackoffSpansMinutes(t *testing.T) {
	var total time.Duration
	for attempt := 1; attempt < 10; attempt++ {
		total += faultBackoff(attempt)
	}
	if faultBackoff(1) != 5*time.Second || faultBackoff(50) != 5*time.Minute || total < 15*time.Minute {
		t.Fatalf("backoff 1: %s, 50: %s, nine tries: %s", faultBackoff(1), faultBackoff(50), total)
	}
}

// A line of max bytes is read, one of max+1 is too long, whatever ends it:
// the line ending counted against the limit let a line of max+1 bytes
// through when it ended in LF alone, and not in CRLF. Read through a
// buffer larger than the lines, and through one smaller.
func TestLineLimitLeavesOutTheLineEnding(t *testing.T) {
	const max = 40
	// A byte order mark before the first line is skipped, not counted.
	for _, bom := range []string{"", "\ufeff"} {
		for _, buffer := range []int{readBuffer, 16} {
			for _, eol := range []string{"\n", "\r\n", ""} {
				for _, size := range []int{max, max + 1} {
					line := strings.Repeat("x", size)
					lr := &lineReader{r: bufio.NewReaderSize(strings.NewReader(bom+line+eol), buffer), max: max}
					got, tooLong, err := lr.next()
					if err != nil {
						t.Fatal(err)
					}
					if want := size > max; tooLong != want || !want && string(got) != line {
						t.Errorf("bom %q, buffer %d, a line of %d bytes ending %q: too long %v (%d bytes read), want %v", bom, buffer, size, eol, tooLong, len(got), want)
					}
					if _, _, err := lr.next(); err != io.EOF {
						t.Errorf("bom %q, buffer %d, a line of %d bytes ending %q: then %v, want the end", bom, buffer, size, eol, err)
					}
				}
			}
		}
	}
}

// An engine's error quoted in a result line is cut between characters:
// cut at byte 300 inside one, the line held invalid UTF-8.
func TestQuoteCutsBetweenCharacters(t *testing.T) {
	for pad := range 4 {
		msg := strings.Repeat("x", pad) + strings.Repeat("€", errorMaxText)
		got := quote(msg)
		if !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || len(got) > errorMaxText+len("…") {
			t.Errorf("pad %d: %q (%d bytes)", pad, got[max(0, len(got)-12):], len(got))
		}
	}
	if got := quote("short"); got != "short" {
		t.Errorf("a short message: %q", got)
	}
}
