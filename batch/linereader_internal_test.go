package batch

import (
	"io"
	"strings"
	"testing"
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
