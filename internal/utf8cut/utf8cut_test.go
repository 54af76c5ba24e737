package utf8cut

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPrefixEndsBetweenCharacters(t *testing.T) {
	s := "ab€c" // € is 3 bytes, at 2..4
	for n, want := range map[int]string{0: "", 2: "ab", 3: "ab", 4: "ab", 5: "ab€", 6: "ab€c", 9: "ab€c"} {
		if got := Prefix(s, n); got != want {
			t.Errorf("Prefix(%q, %d) = %q, want %q", s, n, got, want)
		}
	}
	for n := range 12 {
		got := Shorten(strings.Repeat("€", 4), n)
		if !utf8.ValidString(got) || len(strings.TrimSuffix(got, "…")) > n {
			t.Errorf("Shorten(€€€€, %d) = %q", n, got)
		}
	}
	if got := Shorten("short", 5); got != "short" {
		t.Errorf("Shorten(short, 5) = %q", got)
	}
}
