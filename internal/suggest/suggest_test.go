package suggest

import (
	"strings"
	"testing"
)

func TestNearest(t *testing.T) {
	pricing := []string{"prompt", "completion", "image", "request", "input_cache_read"}
	for key, want := range map[string]string{
		"promt": "prompt", "Prompt": "prompt", "input-cache-read": "input_cache_read",
		"completions": "completion", "zzz": "", "imgae": "image", "": "",
		strings.Repeat("prompt", 11): "", "pr\xffmpt": "",
	} {
		if got := Nearest(key, pricing); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", key, got, want)
		}
	}
	// The plugins' request fields, as their validation tests send them.
	fields := []string{"text", "labels", "tags", "attribute", "model"}
	for key, want := range map[string]string{
		"lables": "labels", "tag": "tags", "atribute": "attribute",
		"tx": "", // two edits from "text", too far for a short name
	} {
		if got := Nearest(key, fields); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", key, got, want)
		}
	}
	if got := Nearest("x", nil); got != "" {
		t.Errorf("Nearest without candidates = %q", got)
	}
}

func TestDistanceCountsRunes(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "", 3}, {"kitten", "sitting", 3}, {"naïve", "naive", 1}, {"日本", "日本語", 1},
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
