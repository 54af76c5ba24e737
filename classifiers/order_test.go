package classifiers

import (
	"reflect"
	"slices"
	"testing"
)

// TestAnswersDoNotDependOnLabelOrder: the label set's centring and
// the softmax summed in the order the labels came, so the same labels
// listed in another order moved a confidence in its fourth decimal
// ("The app freezes whenever I open settings" in multi mode over billing,
// account, bug and feature request: billing 0.3641 one way, 0.364
// another), enough to cross a threshold or break a tie. The engines now
// read a label set in one order, whatever the caller's.
func TestAnswersDoNotDependOnLabelOrder(t *testing.T) {
	sets := []struct {
		labels       []string
		descriptions map[string]string
	}{
		{labels: []string{"billing", "account", "bug", "feature request"}},
		{labels: []string{"billing", "account", "bug", "feature request", "shipping", "refund", "other"},
			descriptions: map[string]string{"bug": "something in the product is broken", "refund": "money returned to the customer"}},
	}
	texts := []string{
		"The app freezes whenever I open settings",
		"I was charged twice for my order and want my money back",
		"Could you add a dark mode to the dashboard?",
		"My parcel never arrived",
	}
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		for _, set := range sets {
			var orders [][]string
			for i := range set.labels {
				rotated := append(slices.Clone(set.labels[i:]), set.labels[:i]...)
				orders = append(orders, rotated, reversed(rotated))
			}
			for _, text := range texts {
				for _, mode := range []Mode{ModeSingle, ModeMulti} {
					var first ClassifyResult
					for i, order := range orders {
						res, err := e.Classify(ctx, ClassifyRequest{Text: text, Labels: order, Descriptions: set.descriptions, Mode: mode, Threshold: 0.3})
						if err != nil {
							t.Fatal(err)
						}
						if i == 0 {
							first = res
						} else if !reflect.DeepEqual(res, first) {
							t.Errorf("%s %s %q: labels in order %v answered\n%+v\nin order %v\n%+v", e.Name(), mode, text, order, res, orders[0], first)
						}
					}
				}
				var firstTags TagResult
				for i, order := range orders {
					res, err := e.Tag(ctx, TagRequest{Text: text, Tags: order, MaxTags: 3})
					if err != nil {
						t.Fatal(err)
					}
					if i == 0 {
						firstTags = res
					} else if !reflect.DeepEqual(res, firstTags) {
						t.Errorf("%s tag %q: tags in order %v answered\n%+v\nin order %v\n%+v", e.Name(), text, order, res, orders[0], firstTags)
					}
				}
			}
		}
	}
}
