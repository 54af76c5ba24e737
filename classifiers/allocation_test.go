//go:build !race

package classifiers

import "testing"

// Reading text in its composed form must cost nothing for text that is
// composed already, which is nearly all of it: ASCII and precomposed
// accents come back as they are.
func TestComposedTextIsNotCopied(t *testing.T) {
	for _, s := range []string{benchTexts[0], "Voici ma réclamation concernant la facture"} {
		if n := testing.AllocsPerRun(100, func() { _ = composed(s) }); n != 0 {
			t.Errorf("composed(%q): %v allocations, want 0", s, n)
		}
	}
}
