package classifiers

import (
	"errors"
	"fmt"
	"math"
	"regexp"

	"strings"
)

// Reading confidences from an answer's log-probabilities. A token's
// alternatives (top_logprobs) are what the model weighed at that point,
// given the tokens before it; only the top k are returned, so what the
// others hold is known only in total (1 - the sum shown) and per token
// (each at most the least probable one shown).

// alternatives returns a token's alternatives with their probabilities,
// the token itself among them even when the upstream left it out, the
// mass of those not shown, and the least probable one shown.
func alternatives(t tokenLogprob) (alts []altProb, rest, least float64) {
	alts = t.TopLogprobs
	seen := false
	for _, a := range alts {
		seen = seen || a.Token == t.Token
	}
	if !seen {
		alts = append(append([]altProb(nil), alts...), altProb{t.Token, t.Logprob})
	}
	shown := 0.0
	least = 1.0
	for _, a := range alts {
		p := math.Exp(a.Logprob)
		shown += p
		least = min(least, p)
	}
	return alts, max(0, 1-shown), least
}

// leadingDigits splits s (after lead, or after white space when s does
// not begin with lead) into its leading digits and whatever follows them.
func leadingDigits(s, lead string) (digits, after string) {
	if lead != "" && strings.HasPrefix(s, lead) {
		s = s[len(lead):]
	} else {
		s = strings.TrimLeft(s, " \t\r\n")
	}
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i], s[i:]
}

// firstDigitToken finds the answer's first token with a digit in it, and
// the part of it before the digit: leading white space, newlines or words
// ("Label 12") are not part of the number.
func firstDigitToken(toks []tokenLogprob) (index int, lead string, ok bool) {
	for i, t := range toks {
		if j := numberStart(t.Token); j >= 0 {
			return i, t.Token[:j], true
		}
	}
	return 0, "", false
}

// numberStart is the index of the first digit in s that begins a number
// (not preceded by a letter or digit), or -1. A digit inside a word —
// "tok0", "gpt4" — is not an answer, so text that only has those is no
// answer at all and the engine asks again or falls back, instead of
// reading a confident 0.
func numberStart(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			continue
		}
		if i > 0 && isAlnum(s[i-1]) {
			for i < len(s) && s[i] >= '0' && s[i] <= '9' {
				i++
			}
			continue
		}
		return i
	}
	return -1
}

func isAlnum(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b == '_'
}

// parsedCode reads the code the answer's text gives, for answers without
// log-probabilities: the first number in it.
func parsedCode(text string, codes []string) (int, error) {
	i := numberStart(text)
	if i < 0 {
		return 0, errors.New("no label number in the answer")
	}
	d, _ := leadingDigits(text[i:], "")
	for k, c := range codes {
		if c == d {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%s is not one of the label numbers %s to %s", d, codes[0], codes[len(codes)-1])
}

// codeDistribution reads the probability of every code from the tokens
// that spell the answer's number, and returns the index of the code the
// answer gives. dist is nil when the answer has no log-probabilities.
//
// Walking the answer's number token by token with q the probability of
// the digits so far: an alternative completing a code gives it q·p; one
// that is a code's first digits (a tokenizer that splits numbers) gives
// q·p to the codes it begins, split evenly, as their later digits are not
// known; anything else (words, white space, numbers outside the list) is
// left out, so dist is conditional on the answer being a label number.
// Codes that no alternative shown at that point begins share the mass not
// shown, but each gets at most the least probable alternative shown, the
// most it can have had outside the top k. The answer's own code gets the
// product of its tokens' probabilities. dist is normalised to sum to 1.
func codeDistribution(ans modelAnswer, codes []string) (chosen int, dist []float64, err error) {
	chosen, err = parsedCode(ans.text, codes)
	if err != nil || ans.logprobs == nil {
		return chosen, nil, err
	}
	start, lead, ok := firstDigitToken(ans.logprobs)
	if !ok {
		return chosen, nil, errors.New("no label number in the answer's tokens")
	}
	width := len(codes[0])
	dist = make([]float64, len(codes))
	prefix, q := "", 1.0
	for i := start; len(prefix) < width; i++ {
		if i >= len(ans.logprobs) {
			return chosen, nil, fmt.Errorf("the answer's number %s is shorter than the label numbers", prefix)
		}
		t := ans.logprobs[i]
		d, after := leadingDigits(t.Token, lead)
		if d == "" || len(prefix)+len(d) > width || (after != "" && len(prefix)+len(d) < width) {
			return chosen, nil, fmt.Errorf("the answer's number does not spell a label number after %q", prefix)
		}
		spreadAlternatives(dist, codes, t, prefix, lead, q)
		q *= math.Exp(t.Logprob)
		prefix += d
		lead = ""
	}
	if prefix != codes[chosen] {
		return chosen, nil, fmt.Errorf("the tokens spell %s, the text %s", prefix, codes[chosen])
	}
	dist[chosen] += q
	var sum float64
	for _, p := range dist {
		sum += p
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		// Every probability underflowed (logprobs of -1000 and below, from
		// a broken server): divided by 0 they were NaN confidences, a 500
		// that billed the model's tokens. The answer's label stands, read
		// as one without logprobs.
		return chosen, nil, nil
	}
	for i := range dist {
		dist[i] /= sum
	}
	return chosen, dist, nil
}

// spreadAlternatives adds to dist what token t's alternatives (except t
// itself, whose code is followed further) say about the codes that begin
// with prefix, weighted by q, the probability of prefix.
func spreadAlternatives(dist []float64, codes []string, t tokenLogprob, prefix, lead string, q float64) {
	width := len(codes[0])
	alts, rest, least := alternatives(t)
	covered := make([]bool, len(codes))
	for _, a := range alts {
		d, after := leadingDigits(a.Token, lead)
		s := prefix + d
		if d == "" || len(s) > width || (after != "" && len(s) < width) {
			continue
		}
		var begun []int
		for k, c := range codes {
			if strings.HasPrefix(c, s) {
				begun = append(begun, k)
				covered[k] = true
			}
		}
		if a.Token == t.Token {
			continue
		}
		for _, k := range begun {
			dist[k] += q * math.Exp(a.Logprob) / float64(len(begun))
		}
	}
	var uncovered []int
	for k, c := range codes {
		if !covered[k] && strings.HasPrefix(c, prefix) {
			uncovered = append(uncovered, k)
		}
	}
	if len(uncovered) == 0 || rest == 0 {
		return
	}
	share := q * min(rest/float64(len(uncovered)), least)
	for _, k := range uncovered {
		dist[k] += share
	}
}

// yesNoLine is one "CODE: yes" line of a multi-mode answer; group 2 is the
// word.
var yesNoLine = regexp.MustCompile(`(?im)^[ \t]*(\d+)[ \t]*[:.)=-]?[ \t]*(yes|no|true|false|y|n)\b`)

// yesNoProbabilities reads a multi-mode answer: for every code, whether
// the model said yes, and P(yes)/(P(yes)+P(no)) from the alternatives of
// the token where the word starts (probs nil without log-probabilities).
// When only one of yes and no is among the alternatives, the other is
// taken to have the least probable alternative's probability, or the mass
// not shown if that is smaller. Every code must have a line.
func yesNoProbabilities(ans modelAnswer, codes []string) (probs []float64, said []bool, err error) {
	index := make(map[string]int, len(codes))
	for i, c := range codes {
		index[c] = i
	}
	said = make([]bool, len(codes))
	seen := make([]bool, len(codes))
	if ans.logprobs != nil {
		probs = make([]float64, len(codes))
	}
	for _, m := range yesNoLine.FindAllStringSubmatchIndex(ans.text, -1) {
		k, ok := index[ans.text[m[2]:m[3]]]
		if !ok || seen[k] {
			continue
		}
		seen[k] = true
		said[k] = isYes(ans.text[m[4]:m[5]])
		if probs != nil {
			probs[k] = yesAt(ans.logprobs, m[4], said[k])
		}
	}
	for k, s := range seen {
		if !s {
			return nil, nil, fmt.Errorf("no yes or no line for label %s", codes[k])
		}
	}
	return probs, said, nil
}

func isYes(w string) bool {
	w = strings.ToLower(w)
	return w == "yes" || w == "y" || w == "true"
}

func isNo(w string) bool {
	w = strings.ToLower(w)
	return w == "no" || w == "n" || w == "false"
}

// yesAt is P(yes) at the token holding text offset off.
func yesAt(toks []tokenLogprob, off int, said bool) float64 {
	pos := 0
	for _, t := range toks {
		if off < pos+len(t.Token) {
			lead := t.Token[:off-pos]
			alts, rest, least := alternatives(t)
			var yes, no float64
			for _, a := range alts {
				if !strings.HasPrefix(a.Token, lead) {
					continue
				}
				w := strings.TrimSpace(a.Token[len(lead):])
				switch {
				case isYes(w):
					yes += math.Exp(a.Logprob)
				case isNo(w):
					no += math.Exp(a.Logprob)
				}
			}
			floor := min(rest, least)
			if yes == 0 {
				yes = floor
			}
			if no == 0 {
				no = floor
			}
			if yes+no == 0 {
				break
			}
			return yes / (yes + no)
		}
		pos += len(t.Token)
	}
	if said {
		return 1
	}
	return 0
}

// maxTagWords is the most words a line of an open-tags answer may have
// to be read as a tag (the prompt asks for one or two).
const maxTagWords = 4

// lineTags reads open tags, one a line (list marks and numbering
// dropped), with the probability of each tag's first token; 0.5 without
// log-probabilities. An answer of none (or N/A, "no tags") is no tags,
// not an error; an answer with no line to read as a tag is one.
func lineTags(ans modelAnswer, maxTags int) ([]LabelScore, error) {
	tags := []LabelScore{}
	seen := map[string]bool{}
	saidNone := false
	pos := 0
	for _, line := range strings.SplitAfter(ans.text, "\n") {
		lineStart := pos
		pos += len(line)
		trimmed := strings.TrimLeft(line, " \t-*•0123456789.)")
		tag := strings.ToLower(strings.TrimSpace(trimmed))
		// Asked for tags of one or two words, a model may still preface
		// them ("Here are the tags:") or answer in prose: such lines are
		// not tags, and an answer of nothing else is asked again.
		if tag == "" || seen[tag] || len(tags) == maxTags || strings.HasSuffix(tag, ":") || len(strings.Fields(tag)) > maxTagWords {
			continue
		}
		// The prompt's way to say no tag fits, or a model's own: it was
		// read as the tag "none", which the text never mentioned.
		if _, ok := noTags[strings.TrimRight(tag, ".!")]; ok {
			saidNone = true
			continue
		}
		seen[tag] = true
		c := 0.5
		if ans.logprobs != nil {
			c = tokenProbAt(ans.logprobs, lineStart+len(line)-len(trimmed))
		}
		tags = append(tags, LabelScore{Label: tag, Confidence: round4(c)})
	}
	if len(tags) == 0 && !saidNone {
		return nil, errors.New("no tags in the answer")
	}
	return tags, nil
}

// noTags are the lines that say no tag fits the text.
var noTags = map[string]struct{}{"none": {}, "n/a": {}, "no tags": {}, "no tag": {}}

// tokenProbAt is the probability of the token holding text offset off.
func tokenProbAt(toks []tokenLogprob, off int) float64 {
	pos := 0
	for _, t := range toks {
		if off < pos+len(t.Token) {
			return math.Exp(t.Logprob)
		}
		pos += len(t.Token)
	}
	return 0
}

// digitScore reads a 0-9 rating as the expected digit over the digit
// alternatives of the answer's first digit token, renormalised over the
// digits shown (with k = 20, every digit the model gives any weight is
// shown), divided by 9; without log-probabilities, the digit / 9.
func digitScore(ans modelAnswer) (float64, error) {
	i := numberStart(ans.text)
	if i < 0 {
		return 0, errors.New("no digit in the answer")
	}
	if d, _ := leadingDigits(ans.text[i:], ""); len(d) != 1 {
		return 0, fmt.Errorf("%s is not one digit from 0 to 9", d)
	}
	stated := float64(ans.text[i] - '0')
	if ans.logprobs == nil {
		return round4(stated / 9), nil
	}
	k, lead, ok := firstDigitToken(ans.logprobs)
	if !ok {
		return round4(stated / 9), nil
	}
	alts, _, _ := alternatives(ans.logprobs[k])
	var sum, mass float64
	for _, a := range alts {
		if d, after := leadingDigits(a.Token, lead); len(d) == 1 && strings.TrimSpace(after) == "" {
			p := math.Exp(a.Logprob)
			sum += p * float64(d[0]-'0')
			mass += p
		}
	}
	if mass == 0 {
		return round4(stated / 9), nil
	}
	return round4(sum / mass / 9), nil
}

// FitTemperature finds the temperature t (0.1 to 10) that minimises the
// mean negative log-likelihood of the gold labels under p^(1/t),
// normalised, for single-mode distributions dists (one per item, rounded
// confidences are fine: zeros are floored at 1e-4) and gold indexes. It
// returns t and the NLL at t = 1 and at t, so a fit is reported with what
// it gained. A grid over log t is enough: the NLL is smooth in t.
func FitTemperature(dists [][]float64, gold []int) (t, nllAt1, nllAtT float64) {
	nll := func(t float64) float64 {
		var s float64
		for i, d := range dists {
			var z float64
			for _, p := range d {
				z += math.Pow(max(p, 1e-4), 1/t)
			}
			s -= math.Log(math.Pow(max(d[gold[i]], 1e-4), 1/t) / z)
		}
		return s / float64(len(dists))
	}
	t, nllAtT = 1, nll(1)
	nllAt1 = nllAtT
	for k := -100; k <= 100; k++ {
		c := math.Pow(10, float64(k)/100)
		if v := nll(c); v < nllAtT {
			t, nllAtT = c, v
		}
	}
	return round4(t), nllAt1, nllAtT
}
