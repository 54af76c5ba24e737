// Package utf8cut cuts text to a byte bound between characters: cut
// inside one, a quoted error, a logged answer or a prompt line holds
// invalid UTF-8, which JSON readers replace or refuse.
package utf8cut

import "unicode/utf8"

// Prefix is the longest start of s of at most n bytes that ends between
// characters.
func Prefix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Shorten is s, or when longer than n bytes its Prefix and "…".
func Shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Prefix(s, n) + "…"
}
