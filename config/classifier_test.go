package config

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestSavedClassifierDefaults: golden assertions cannot reach into maps, so
// the saved classifiers of plugins_defaults.yamltest are checked here.
func TestSavedClassifierDefaults(t *testing.T) {
	raw, err := os.ReadFile("testdata/plugins_defaults.yamltest")
	if err != nil {
		t.Fatal(err)
	}
	input, _, _ := strings.Cut(string(raw), goldenSeparator)
	cfg, err := parse("gateway.yaml", []byte(input), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Classifier{
		"support-intent": {
			Labels:       []string{"billing", "bug"},
			Descriptions: map[string]string{"billing": "Charges and refunds"},
			Examples:     map[string][]string{"bug": {"The app crashes on start"}},
			Mode:         ModeSingle,
			Threshold:    DefaultThreshold,
		},
		"everything": {Labels: []string{"a", "b"}, Mode: ModeMulti, Threshold: 0},
	}
	if !reflect.DeepEqual(cfg.Classifiers, want) {
		t.Errorf("classifiers = %+v\nwant %+v", cfg.Classifiers, want)
	}
	if got := cfg.ClassifierNames(); !reflect.DeepEqual(got, []string{"everything", "support-intent"}) {
		t.Errorf("ClassifierNames = %v", got)
	}
}

func TestCheckClassification(t *testing.T) {
	many := make([]string, MaxLabels+1)
	for i := range many {
		many[i] = strings.Repeat("x", i+1)
	}
	for _, c := range []struct {
		labels    []string
		desc      map[string]string
		mode      string
		threshold float64
		want      []FieldProblem
	}{
		{labels: []string{"a"}, threshold: 0.5},
		{labels: nil, threshold: 0.5, want: []FieldProblem{{"labels", "labels must have 1 to 200 entries, got 0"}}},
		{labels: many, threshold: 0.5, want: []FieldProblem{{"labels", "labels must have 1 to 200 entries, got 201"}}},
		{labels: []string{"a", "", "a"}, threshold: 0.5, want: []FieldProblem{{"labels[1]", "labels[1] is empty"}, {"labels[2]", `labels has "a" twice`}}},
		// One text in two Unicode forms is one label, whatever the engine.
		{labels: []string{"café", "tea", "cafe\u0301"}, threshold: 0.5, want: []FieldProblem{
			{"labels[2]", `labels has "caf\u00e9" and "cafe\u0301", one text written two ways (an accent as one character, and as a letter and a combining mark): send it once`}}},
		// What only the offline engines cannot read is theirs to refuse
		// (OfflineLabelProblems): the llm engine reads labels as written.
		{labels: []string{"C", "C++", "C#", "👍", "Bug", "bug!"}, threshold: 0.5},
		{labels: []string{"a"}, desc: map[string]string{"b": "x"}, threshold: 0.5, want: []FieldProblem{{"descriptions.b", `descriptions has a key "b" that is not a label`}}},
		// A saved classifier is held to it as a request is.
		{labels: []string{"a", "b"}, desc: map[string]string{"a": "", "b": "\u3164 "}, threshold: 0.5, want: []FieldProblem{{"descriptions.b", `descriptions of "b" holds only whitespace or invisible characters: leave it out, or say in plain words what the label means`}}},
		{labels: []string{"a"}, mode: "both", threshold: -0.1, want: []FieldProblem{{"mode", `mode must be single or multi, got "both"`}, {"threshold", "threshold must be a number between 0 and 1, got -0.1"}}},
	} {
		got := CheckClassification(Classifier{Labels: c.labels, Descriptions: c.desc, Mode: c.mode, Threshold: c.threshold}, DefaultMaxTextBytes)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("CheckClassification(%d labels, %v, %q, %v) = %v, want %v", len(c.labels), c.desc, c.mode, c.threshold, got, c.want)
		}
		first := FirstClassificationProblem(Classifier{Labels: c.labels, Descriptions: c.desc, Mode: c.mode, Threshold: c.threshold}, DefaultMaxTextBytes)
		if want := c.want[:min(len(c.want), 1)]; !reflect.DeepEqual(first, want) {
			t.Errorf("FirstClassificationProblem(%d labels, %v, %q, %v) = %v, want %v", len(c.labels), c.desc, c.mode, c.threshold, first, want)
		}
	}
}

// A request is refused with its first problem, and the checks stop
// there: a body of 400,000 keys that are not labels, or of a million
// empty examples, took seconds of CPU to sort, walk and word every one
// of them for a 400 that quotes the first.
func TestFirstClassificationProblemStopsThere(t *testing.T) {
	examples := make(map[string][]string, 100_000)
	for i := range 100_000 {
		examples[fmt.Sprint("k", i)] = nil
	}
	empty := map[string][]string{"a": make([]string, 1_000_000)}
	for name, cl := range map[string]Classifier{
		"keys that are not labels": {Labels: []string{"a"}, Examples: examples},
		"empty examples":           {Labels: []string{"a"}, Examples: empty},
	} {
		allocs := testing.AllocsPerRun(1, func() { FirstClassificationProblem(cl, DefaultMaxTextBytes) })
		if got := FirstClassificationProblem(cl, DefaultMaxTextBytes); len(got) != 1 || allocs > 100 {
			t.Errorf("%s: %v in %v allocations; want one problem, found without wording the others", name, got, allocs)
		}
	}
}

// Characters that show nothing are blank, the Hangul fillers too, which
// Unicode counts as letters: "\u3164" passed as a text, an attribute and
// a label.
func TestInvisibleCharactersAreBlank(t *testing.T) {
	for _, s := range []string{"\u3164", "\u115f", "\u034f", "\ufe0f", "\u2800", " \u200b\u3164 "} {
		if !Blank(s) {
			t.Errorf("%+q is not blank", s)
		}
		if k := LabelKey(s); k != "" {
			t.Errorf("label %+q reads as %q", s, k)
		}
	}
	for _, s := range []string{"bug", "é", "\u3164bug"} {
		if Blank(s) {
			t.Errorf("%+q is blank", s)
		}
	}
	if LabelKey("bug\u3164") != LabelKey("bug") {
		t.Error("a Hangul filler made a label another")
	}
}

// TestIssueOnlyTheOfflineEnginesRefuseLabelsTheyCannotRead: labels that
// differ only in case, punctuation, symbols, spacing or invisible
// characters, or have no letter or digit, were refused for every engine
// as labels "no engine tells apart", the llm engine too, which reads "C",
// "C++" and "C#" as three languages. They are refused where an offline
// engine answers (OfflineLabelProblems, which the plugins and the saved
// classifiers under an offline plugins.engine call), in words that say
// so and name the llm engine as the way to tell them apart.
func TestIssueOnlyTheOfflineEnginesRefuseLabelsTheyCannotRead(t *testing.T) {
	for _, labels := range [][]string{{"C", "C++", "C#"}, {"rating 👍", "rating 👎"}, {"👍", "👎"}, {"Bug", "bug!"}} {
		if ps := CheckLabelList("labels", labels, 1); len(ps) > 0 {
			t.Errorf("labels %+q for every engine: %v", labels, ps)
		}
	}
	const offline = "the offline engines (semantic and lexical) read only words and do not tell them apart; the llm engine does (send llm)"
	for _, c := range []struct {
		labels []string
		want   []FieldProblem
	}{
		{[]string{"Bug", "bug", "bug ", "bug  report", "Bug report"}, []FieldProblem{
			{"labels[1]", `labels has "Bug" and "bug", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline},
			{"labels[2]", `labels has "Bug" and "bug ", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline},
			{"labels[4]", `labels has "bug  report" and "Bug report", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline}}},
		{[]string{"feature_request", "feature request", "feature-request"}, []FieldProblem{
			{"labels[1]", `labels has "feature_request" and "feature request", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline},
			{"labels[2]", `labels has "feature_request" and "feature-request", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline}}},
		{[]string{"bug", "bug.", "BUG!", "bug\u200b", "C", "C++"}, []FieldProblem{
			{"labels[1]", `labels has "bug" and "bug.", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline},
			{"labels[2]", `labels has "bug" and "BUG!", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline},
			{"labels[3]", `labels has "bug" and "bug\u200b", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline},
			{"labels[5]", `labels has "C" and "C++", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline}}},
		{[]string{"a", "_", "-", "!!!", "x\u200b", "👍"}, []FieldProblem{
			{"labels[1]", `labels[1] ("_") has no letter or digit: the offline engines (semantic and lexical) read only words and find none in it; the llm engine reads it as written (send llm)`},
			{"labels[2]", `labels[2] ("-") has no letter or digit: the offline engines (semantic and lexical) read only words and find none in it; the llm engine reads it as written (send llm)`},
			{"labels[3]", `labels[3] ("!!!") has no letter or digit: the offline engines (semantic and lexical) read only words and find none in it; the llm engine reads it as written (send llm)`},
			{"labels[5]", `labels[5] ("👍") has no letter or digit: the offline engines (semantic and lexical) read only words and find none in it; the llm engine reads it as written (send llm)`}}},
		// Refused as one label by CheckLabelList, for every engine: not
		// again here.
		{[]string{"café", "cafe\u0301", "a", "a", " "}, nil},
	} {
		if got := OfflineLabelProblems("labels", c.labels, "send llm", 0); !reflect.DeepEqual(got, c.want) {
			t.Errorf("OfflineLabelProblems(%+q) = %v, want %v", c.labels, got, c.want)
		}
		if got, want := OfflineLabelProblems("labels", c.labels, "send llm", 1), c.want[:min(len(c.want), 1)]; !reflect.DeepEqual(got, want) && len(want) > 0 {
			t.Errorf("OfflineLabelProblems(%+q, first) = %v, want %v", c.labels, got, want)
		}
	}
}

// TestIssueVowelSignsMakeLabelsDistinct: a combining mark ended a word,
// so labels that differ in a vowel sign (Devanagari दिन and दान, day and
// donation; Arabic كَتَبَ and كُتُب, he wrote and books) or in an accent no
// precomposed letter has were refused as one label "which differ only
// in ... how an accent is written". A mark after a letter is part of
// its word; NFC and NFD of one word are still one label.
func TestIssueVowelSignsMakeLabelsDistinct(t *testing.T) {
	for _, labels := range [][]string{
		{"दिन", "दान"}, {"पैसा", "पेसा"}, {"बिल", "बाल"}, {"كَتَبَ", "كُتُب"}, {"ฉัน", "ฉน"},
		{"cafe", "café"}, {"x", "x\u0302"}, {"resume", "re\u0301sume\u0301"},
	} {
		if ps := append(CheckLabelList("labels", labels, 1), OfflineLabelProblems("labels", labels, "llm", 0)...); len(ps) > 0 {
			t.Errorf("labels %+q: %v, want them distinct", labels, ps)
		}
	}
	for _, labels := range [][]string{
		{"Dान", "dान"}, {"बाल", "बाल\ufe0f"}, {"बाल", "बाल!"}, {"x\u0302", "X\u0302"},
	} {
		if ps := OfflineLabelProblems("labels", labels, "llm", 0); len(ps) != 1 || ps[0].Field != "labels[1]" {
			t.Errorf("labels %+q: %v, want the second refused as the first", labels, ps)
		}
	}
	if ps := CheckLabelList("labels", []string{"café", "cafe\u0301"}, 1); len(ps) != 1 || ps[0].Field != "labels[1]" {
		t.Errorf("café in NFC and NFD: %v, want the second refused as the first", ps)
	}
	if k := LabelKey("मेरे बाल"); k != "मेरे बाल" {
		t.Errorf("LabelKey(मेरे बाल) = %q", k)
	}
	// A mark that follows no letter is no word of its own.
	if k := LabelKey("\u0301bug"); k != "bug" {
		t.Errorf("LabelKey of a leading combining mark: %+q", k)
	}
	// A soft hyphen or a joiner inside a word leaves it whole; a zero-width
	// space ends it.
	for label, want := range map[string]string{"re\u00adfund": "refund", "sa\u200dfari\u00ad now": "safari now", "re\u200bfund": "re fund", "\u00adbug": "bug"} {
		if k := LabelKey(label); k != want {
			t.Errorf("LabelKey(%+q) = %+q, want %+q", label, k, want)
		}
	}
}

// TestIssueKeysNameLabelsInEitherUnicodeForm: labels ["café", "tea"]
// with descriptions {"cafe\u0301": …} were refused with 'descriptions
// has a key "café" that is not a label', quoting a key that looks like
// the label. A key names its label in either form, as the label checks
// read labels, and ByLabel moves it to the label's spelling; a key that
// names no label is quoted with escapes when it is not composed.
func TestIssueKeysNameLabelsInEitherUnicodeForm(t *testing.T) {
	labels := []string{"café", "tea"}
	cl := Classifier{Labels: labels, Threshold: 0.5,
		Descriptions: map[string]string{"cafe\u0301": "coffee and espresso", "tea": "green or black"},
		Examples:     map[string][]string{"cafe\u0301": {"an espresso please"}}}
	if ps := CheckClassification(cl, DefaultMaxTextBytes); len(ps) > 0 {
		t.Errorf("a description keyed by a label in NFD: %v", ps)
	}
	if got := ByLabel(labels, cl.Descriptions); !reflect.DeepEqual(got, map[string]string{"café": "coffee and espresso", "tea": "green or black"}) {
		t.Errorf("ByLabel(descriptions) = %+q", got)
	}
	if got := ByLabel(labels, cl.Examples); !reflect.DeepEqual(got, map[string][]string{"café": {"an espresso please"}}) {
		t.Errorf("ByLabel(examples) = %+q", got)
	}
	// Labels in NFD, keys in NFC: the keys move to the labels' spelling.
	if got := ByLabel([]string{"cafe\u0301"}, map[string]string{"café": "x"}); !reflect.DeepEqual(got, map[string]string{"cafe\u0301": "x"}) {
		t.Errorf("ByLabel of an NFD label = %+q", got)
	}
	// The description is held to max_text_bytes under either key.
	long := Classifier{Labels: labels, Threshold: 0.5, Descriptions: map[string]string{"cafe\u0301": strings.Repeat("x", 11)}}
	if ps := CheckClassification(long, 10); len(ps) == 0 || ps[0].Field != "descriptions.café" {
		t.Errorf("a long description keyed in NFD: %v", ps)
	}
	for _, c := range []struct {
		cl   Classifier
		want FieldProblem
	}{
		{Classifier{Labels: labels, Threshold: 0.5, Descriptions: map[string]string{"cafe\u0301": "a", "café": "b"}},
			FieldProblem{"descriptions.café", `descriptions has keys "cafe\u0301" and "caf\u00e9", one label written two ways (an accent as one character, and as a letter and a combining mark): send it once`}},
		{Classifier{Labels: labels, Threshold: 0.5, Examples: map[string][]string{"te\u0301a": {"x"}}},
			FieldProblem{"examples.te\u0301a", `examples has a key "te\u0301a" that is not a label`}},
		{Classifier{Labels: labels, Threshold: 0.5, Examples: map[string][]string{"cafe\u0301": {" "}}},
			FieldProblem{"examples.cafe\u0301[0]", `examples of "cafe\u0301": entry 0 is empty`}},
	} {
		if ps := CheckClassification(c.cl, DefaultMaxTextBytes); len(ps) != 1 || ps[0] != c.want {
			t.Errorf("%+v: %v, want %v", c.cl, ps, c.want)
		}
	}
}

// uptoPlugins is a gateway.yaml of one upstream and one model, up to its
// plugins section's first setting: what follows starts at line 9, where
// the tests' messages place it.
const uptoPlugins = `upstreams:
  - name: local
    base_url: http://127.0.0.1:8000/v1
models:
  - id: first
    context_length: 2048
    max_output_length: 512
plugins:
`

// A saved classifier whose labels, descriptions and examples take more
// than MaxLabelSetBytes was loaded, and every classify request naming it
// failed on a label set the client never sent. It is refused at load, on
// its line, with the words a request gets; one at the bound loads.
func TestSavedClassifierOverTheLabelSetBoundIsRefused(t *testing.T) {
	head := uptoPlugins + `  max_text_bytes: 1MiB
classifiers:
  big:
    labels: [a, b]
    descriptions:
      a: `
	for _, c := range []struct {
		description int
		want        string
	}{
		{MaxLabelSetBytes - 2, ""},
		{MaxLabelSetBytes - 1, fmt.Sprintf("gateway.yaml:12:13: classifiers.big.labels: labels, descriptions and examples take %d bytes; at most %d are accepted (as a batch job keeps)", MaxLabelSetBytes+1, MaxLabelSetBytes)},
	} {
		_, err := parse("gateway.yaml", []byte(head+strings.Repeat("x", c.description)+"\n"), noEnv)
		if got := fmt.Sprint(err); c.want == "" && err != nil || c.want != "" && got != c.want {
			t.Errorf("a description of %d bytes: %v; want %q", c.description, err, c.want)
		}
	}
}

// A saved classifier whose labels an offline engine cannot tell apart
// loads where a request naming it may be answered by the llm (plugins
// engine auto or llm), and is refused at load where every request naming
// no model is answered offline, saying which setting decides.
func TestSavedClassifierOfLabelsOnlyTheLLMTellsApart(t *testing.T) {
	for _, c := range []struct{ engine, want string }{
		{"auto", ""},
		{"llm", ""},
		{"semantic", `gateway.yaml:13:17: classifiers.langs.labels[1]: labels has "C" and "C++", which differ only in case, spacing, punctuation, symbols or invisible characters: the offline engines (semantic and lexical) read only words and do not tell them apart; the llm engine does (plugins.engine is semantic: set it to auto or llm)`},
		{"lexical", `plugins.engine is lexical: set it to auto or llm`},
	} {
		yaml := uptoPlugins + `  engine: ` + c.engine + `
classifiers:
  langs:
    mode: single
    labels: [C, C++, Go]
`
		_, err := parse("gateway.yaml", []byte(yaml), noEnv)
		if got := fmt.Sprint(err); c.want == "" && err != nil || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("plugins.engine %s: %v; want %q", c.engine, err, c.want)
		}
	}
}
