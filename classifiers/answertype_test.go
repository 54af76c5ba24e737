package classifiers

import "testing"

// Quantity words are matched as written: stemmed, "one" became "on", and a
// document saying "refunds on sale items" held an answer to "how long".
func TestQuantityWordsAreMatchedAsWritten(t *testing.T) {
	query := analyze("how long do refunds take?").terms
	for text, want := range map[string]bool{
		"We do not offer refunds on sale items.":       false,
		"I am sure it may be fine.":                    false,
		"Refunds take one week.":                       true,
		"Refunds take a few days.":                     true,
		"Refunds are issued within 5 days of request.": true,
	} {
		d := analyze(text)
		if got := hasAnswerKind(kindQuantity, &d, text, query); got != want {
			t.Errorf("%q holds a quantity: %v, want %v", text, got, want)
		}
	}
}
