package classifiers

import (
	"math"
	"slices"
	"strings"
)

// The cue lists below are written from general knowledge of how these
// kinds of text read (support escalations, abuse, spam, business letters,
// chat), not fitted to any evaluation set. Weights: about 1 for a hint, 3
// for a clear sign, 5 for a sign on its own.

var urgencyCues = compileCues(`
4 urgent
4 urgently
4 asap
4 as soon as possible
3.5 emergency
3.5 immediately
3 immediate
3 critical
3 right away
3 outage
2.5 are down
2.5 went down
2.5 been down
2.5 offline
2 not working
2 fail
2.5 fire
2 deadline
1.5 today
1.5 tonight
1.2 now
1.5 quickly
2 hurry
2.5 time-sensitive
3 top priority
2.5 high priority
2.5 blocker
2 blocking
2 crash
1.5 broken
1.2 unable
1 stuck
1 help
2 within the hour
1.5 end of day
1.5 eod
1 error
1.5 security
3 sev1
3 p1
2 danger
2 dangerous
2.5 injured
3 ambulance
1.5 warning
1 important
1 soon
-3 no hurry
-3 not urgent
-2.5 when you have time
-2 low priority
-1.5 someday
-1.5 eventually
-1 sometime
-1.5 fyi
-1.5 for your information
-1.5 no deadline
-1.5 take your time
-0.5 later
`)

var toxicityCues = compileCues(`
3 idiot
3 idiotic
3 moron
3 moronic
2.5 stupid
2.5 dumb
3 imbecile
3 cretin
3 loser
2.5 pathetic
2.5 worthless
1 useless
3.5 scum
2.5 jerk
2 clown
2 fool
1.5 foolish
1.5 ignorant
1.5 incompetent
4.5 retard
4.5 retarded
1.5 trash
1.5 garbage
4 piece of trash
4 piece of shit
2 ugly
2 disgusting
2.5 freak
2 creep
2.5 parasite
3 vermin
4.5 subhuman
4 fuck
4 fucking
4 fucker
4.5 motherfucker
2.5 shit
2.5 shitty
2 bullshit
1.5 crap
1 damn
1.5 goddamn
3.5 bitch
3.5 bastard
4 asshole
3 dick
3 prick
4.5 cunt
4 whore
4 slut
3.5 wanker
3.5 twat
3 douche
4 screw you
3.5 piss off
4.5 fuck off
4 drop dead
5 kill yourself
5 kys
1.5 go away
3.5 nobody likes you
3.5 you suck
3.5 hate you
5 kill you
4 hurt you
3.5 watch your back
3 you'll pay
2 shame on you
2.5 get a life
2.5 what is wrong with you
`)

var spamCues = compileCues(`
1.5 free
2 for free
3 100% free
2.5 free gift
2 free trial
2 win
2 winner
2 won
3 prize
2 claim
2.5 congratulations
1.5 lucky
3.5 lottery
3 jackpot
1.5 reward
2 click
3 click the link
3 tap here
1 link
1.5 offer
2.5 order now
2 shop now
2.5 today only
2.5 exclusive deal
1 deal
1.5 discount
1 money
2 cash
2 earn
3 extra income
3 guaranteed
2 guarantee
3 risk free
3 risk-free
2.5 no risk
1.5 investment
2.5 crypto
2.5 bitcoin
3 forex
3 double your
1.5 rich
2.5 millionaire
3 pills
5 viagra
5 cialis
3 weight loss
2.5 lose weight
1.5 dating
2.5 sexy
4 xxx
1.5 verify
2.5 unusual activity
3 credit card details
2.5 login details
2 update your payment
3 inheritance
2.5 beneficiary
3 wire transfer
1.5 dear customer
2 unsubscribe
2 opt out
1.5 promo
1.5 promotion
1.5 coupon
1 sale
1 urgent
1.5 hurry
2.5 don't miss
3 once in a lifetime
`)

var formalCues = compileCues(`
1.5 dear
3 sincerely
2.5 regards
3 best regards
3.5 yours faithfully
3.5 yours sincerely
4 to whom it may concern
3 herewith
2 accordingly
2.5 furthermore
2.5 moreover
1.5 therefore
1 however
1.5 regarding
2.5 with regard to
3 in accordance with
2 kindly
2 inquire
1 mr
1 mrs
1 ms
1 appreciate
1.5 shall
1 please
-2 hey
-0.7 hi
-2.5 yo
-2.5 sup
-3 lol
-3.5 lmao
-3 rofl
-2.5 omg
-2.5 haha
-2.5 hahaha
-2.5 hehe
-2.5 gonna
-2.5 wanna
-2.5 gotta
-2 kinda
-2 sorta
-2.5 dunno
-2 ya
-1.5 yeah
-2 yep
-2 nope
-2.5 nah
-0.5 ok
-0.5 okay
-1.2 cool
-1 awesome
-2.5 dude
-2.5 bro
-1 guys
-2.5 u
-2.5 ur
-2 r
-2.5 thx
-2 pls
-2.5 plz
-2 btw
-3 brb
-3 idk
-2 imo
-2.5 tbh
-2.5 cuz
-2.5 coz
-1 stuff
-2.5 wat
-2 ain't
-2.5 y'all
-2.5 gimme
-2.5 lemme
`)

// lowQualityCues are chat shorthand and filler that say little.
var lowQualityCues = compileCues(`
2 lol
2 idk
1.5 u
1.5 ur
1 omg
1.5 lmao
`)

var secondPerson = setOf(`you your you're yourself yourselves u ur ya youre`)

// scoreAttribute scores text on attribute: the six common attributes have
// their own scorers; other names that mean one of them are mapped to it;
// anything else is scored by how much the text talks about the
// attribute's name and description.
func scoreAttribute(text, attribute, description string) float64 {
	d := analyze(text)
	switch kind, inverted := attributeKind(attribute); kind {
	case "sentiment":
		return maybeInvert(sentimentScore(text), inverted)
	case "urgency":
		return maybeInvert(urgencyScore(&d), inverted)
	case "toxicity":
		return maybeInvert(toxicityScore(&d), inverted)
	case "spam":
		return maybeInvert(spamScore(&d), inverted)
	case "formality":
		return maybeInvert(formalityScore(&d), inverted)
	case "quality":
		return maybeInvert(qualityScore(&d), inverted)
	}
	return describedScore(text, &d, attribute, description)
}

func maybeInvert(s float64, inverted bool) float64 {
	if inverted {
		return 1 - s
	}
	return s
}

// attributeAliases map stems of attribute names to the scorer they mean;
// a leading "!" means its opposite.
var attributeAliases = func() map[string]string {
	m := make(map[string]string)
	add := func(kind, words string) {
		for w := range strings.FieldsSeq(words) {
			m[stem(w)] = kind
		}
	}
	add("sentiment", `sentiment positivity positive happiness happy satisfaction satisfied polarity`)
	add("!sentiment", `negativity negative unhappiness dissatisfaction`)
	add("urgency", `urgency urgent priority emergency`)
	add("toxicity", `toxicity toxic offensive offensiveness abuse abusive insult insulting hate harassment profanity rudeness rude obscene obscenity vulgarity hostility`)
	add("spam", `spam spammy scam fraud phishing promotional junk`)
	add("formality", `formality formal professionalism`)
	add("!formality", `informality informal casual casualness`)
	add("quality", `quality readability clarity informativeness coherence`)
	return m
}()

func attributeKind(attribute string) (kind string, inverted bool) {
	for _, t := range analyze(attribute).terms {
		if k, ok := attributeAliases[t.stem]; ok {
			if strings.HasPrefix(k, "!") {
				return k[1:], true
			}
			return k, false
		}
	}
	return "", false
}

// sentimentScore is VADER's compound score (-1..1) moved to 0..1.
func sentimentScore(text string) float64 {
	return (vader().PolarityScores(text).Compound + 1) / 2
}

func urgencyScore(d *doc) float64 {
	e := urgencyCues.sum(d.terms)
	e += 0.7 * capped(d.stats.exclaims, 2)
	e += 0.5 * capped(capsWords(d.terms), 2)
	return evidenceScore(e, 0.2, 3)
}

// toxicityScore adds cue evidence, half again when the clause addresses
// someone ("you"), and strongly negative VADER words aimed at "you" that
// no cue names. Negative words alone ("I hate Mondays") are not toxic.
func toxicityScore(d *doc) float64 {
	addressed := make(map[int32]bool)
	for _, t := range d.terms {
		if _, ok := secondPerson[t.word]; ok {
			addressed[t.clause] = true
		}
	}
	var e float64
	covered := make(map[int]bool)
	toxicityCues.scan(d.terms, func(m cueMatch) {
		w := m.weight
		if w > 0 && addressed[d.terms[m.at].clause] {
			w *= 1.5
		}
		e += w
		for k := m.at; k < m.end; k++ {
			covered[k] = true
		}
	})
	lex := vader().Lexicon
	for i, t := range d.terms {
		if covered[i] || !addressed[t.clause] {
			continue
		}
		if v := lex[t.word]; v <= -2 {
			e += 1
		}
	}
	return evidenceScore(e, 0.05, 3.5)
}

func spamScore(d *doc) float64 {
	e := spamCues.sum(d.terms)
	e += 2 * capped(d.stats.urls, 2)
	e += 1.5 * capped(d.stats.money, 2)
	e += 1 * capped(d.stats.percents, 1)
	e += 0.6 * capped(d.stats.exclaims, 3)
	e += 0.7 * capped(capsWords(d.terms), 3)
	return evidenceScore(e, 0.08, 4)
}

// formalityScore weighs formal against informal cues and the shape of the
// text: contractions, a lower-case start, emoji, stretched words ("sooo")
// and piled-up punctuation read informal; long words and a closing full
// stop read formal. 0.5 is neither.
func formalityScore(d *doc) float64 {
	st := &d.stats
	e := formalCues.sum(d.terms)
	e -= 0.6 * capped(contractions(d.terms), 3)
	if !st.startsUpper {
		e -= 1
	}
	if !st.endsPunct {
		e -= 0.5
	} else if st.exclaims == 0 {
		e += 0.3
	}
	e -= 1.5 * capped(st.emoji, 2)
	e -= 1.5 * capped(st.stretched, 2)
	e -= 1.5 * capped(st.repeatPunct, 2)
	e -= 0.5 * capped(st.exclaims, 3)
	words, letters, long := 0, 0, 0
	for _, t := range d.terms {
		if t.stem == "?" {
			continue
		}
		words++
		letters += len(t.word)
		if len(t.word) >= 9 {
			long++
		}
	}
	if words > 0 {
		e += 0.8 * (float64(letters)/float64(words) - 4.5)
	}
	e += 0.3 * capped(long, 4)
	return logistic(e / 2)
}

// qualityScore rates writing quality: a well-formed sentence that says
// several specific things scores high; fragments, shorthand, repetition,
// shouting and keyboard mashing score low.
func qualityScore(d *doc) float64 {
	st := &d.stats
	e := -1.0
	if st.startsUpper {
		e += 0.5
	}
	if st.endsPunct && st.repeatPunct == 0 {
		e += 0.5
	}
	total, content := 0, 0
	seen := make(map[string]struct{}, len(d.terms))
	uniqueWords := make(map[string]struct{}, len(d.terms))
	for _, t := range d.terms {
		if t.stem == "?" {
			continue
		}
		total++
		uniqueWords[t.word] = struct{}{}
		if !t.stop {
			if _, ok := seen[t.stem]; !ok {
				seen[t.stem] = struct{}{}
				content++
			}
		}
	}
	e += 0.35 * capped(content, 14)
	if total >= 3 {
		e -= 4 * (1 - float64(len(uniqueWords))/float64(total))
	}
	e += 0.3 * capped(st.digitWords, 3)
	e -= lowQualityCues.sum(d.terms)
	if st.letters >= 5 && float64(st.upper) > 0.5*float64(st.letters) {
		e -= 1.5
	}
	e -= 1 * capped(st.repeatPunct, 2)
	e -= 1 * capped(st.stretched, 2)
	e -= 0.5 * capped(st.emoji, 2)
	return logistic((e - 2) / 1.2)
}

// describedScore scores an attribute the engine has no scorer for: the
// similarity of the text to the attribute's name and description (words
// the caller chose to describe it), and, when those words carry a
// polarity in the sentiment lexicon ("anger", "politeness"), how far the
// text's sentiment goes the same way. Honest, and weak: give a
// description, or use the llm engine for such attributes. A name of
// function words only ("down", "over") is read by its words (see
// literalWords).
func describedScore(text string, d *doc, attribute, description string) float64 {
	literal := literalWords([]string{attribute})
	terms := d.terms
	if literal != nil {
		terms = slices.Clone(terms)
		readLiterally(terms, literal)
	}
	textBag := bagOf(terms)
	b := newBagBuilder(8)
	name := analyzeFor(strings.ReplaceAll(attribute, "_", " "), literal)
	b.add(name.terms, nameWeight)
	desc := analyzeFor(description, literal)
	b.add(desc.terms, descriptionWeight)
	profile := b.build()
	sim := 1 - math.Exp(-cosine(&textBag, &profile)/0.25)

	polarity := 0.0
	lex := vader().Lexicon
	for _, t := range append(name.terms, desc.terms...) {
		polarity += lex[t.word]
	}
	if math.Abs(polarity) < 1 {
		return sim
	}
	compound := vader().PolarityScores(text).Compound
	aligned := (1 + compound*math.Copysign(1, polarity)) / 2
	return 0.5*sim + 0.5*aligned
}

// capsWords counts shouted words: capitals, at least three letters.
func capsWords(terms []term) int {
	n := 0
	for _, t := range terms {
		if t.caps && len(t.word) >= 3 {
			n++
		}
	}
	return n
}

var contractionSuffixes = [...]string{"n't", "'m", "'re", "'ll", "'ve", "'d"}

var contractedIs = setOf(`it's that's what's there's he's she's here's who's where's how's let's`)

func contractions(terms []term) int {
	n := 0
	for _, t := range terms {
		if _, ok := contractedIs[t.word]; ok {
			n++
			continue
		}
		for _, s := range contractionSuffixes {
			if strings.HasSuffix(t.word, s) {
				n++
				break
			}
		}
	}
	return n
}
