package suggest

import (
	"strings"
	"unicode/utf8"
)

// maxNameBytes bounds the names compared: the distance is quadratic in
// length, and a name this long is no typo of a field.
const maxNameBytes = 64

// Nearest returns the candidate nearest to name when it is near enough to
// be a typo, or "". Case is ignored and '-' reads as '_', so
// "Input-Cache-Read" finds "input_cache_read"; candidates are compared as
// given, so pass them lowercase. A match may be two edits away, one for
// names of up to four characters, where two edits would make most short
// names look alike. On a tie the earlier candidate wins.
func Nearest(name string, candidates []string) string {
	if !utf8.ValidString(name) || len(name) > maxNameBytes {
		return ""
	}
	norm := strings.ToLower(strings.ReplaceAll(name, "-", "_"))
	best, bestDist := "", 0
	for _, c := range candidates {
		d := Distance(norm, c)
		if best == "" || d < bestDist {
			best, bestDist = c, d
		}
	}
	limit := 2
	if utf8.RuneCountInString(name) <= 4 {
		limit = 1
	}
	if best == "" || bestDist > limit {
		return ""
	}
	return best
}

// Distance is the Levenshtein distance between a and b, counted in runes.
func Distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
