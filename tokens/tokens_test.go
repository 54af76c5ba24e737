package tokens

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	tiktoken "github.com/pkoukk/tiktoken-go"
	loader "github.com/pkoukk/tiktoken-go-loader"
)

// reference is tiktoken-go's o200k_base, which Count must agree with.
func reference(t testing.TB) *tiktoken.Tiktoken {
	t.Helper()
	tiktoken.SetBpeLoader(loader.NewOfflineLoader())
	enc, err := tiktoken.GetEncoding("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// corpus is text of many kinds: this repository's prose, code and data
// files, then generated text that stresses the splitter and the merges.
func corpus(t testing.TB) []string {
	t.Helper()
	var texts []string
	for _, pattern := range []string{"../README.md", "../*.yaml", "../proxy/*.go", "../classifiers/testdata/*/*", "../billing/schema/*"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			texts = append(texts, string(data))
			texts = append(texts, strings.Split(string(data), "\n")...)
		}
	}
	if len(texts) < 100 {
		t.Fatalf("corpus: only %d texts found", len(texts))
	}
	texts = append(texts,
		"", " ", "  \n\n  ", "\r\n", "a", "I'm here, we'LL see; THEY'RE 'd",
		"12345678901234567890 3.14159 1,000,000 0x1F",
		"Grüße aus München, naïve café — “quotes” … ½",
		"日本語のテキストと中文文本，还有한국어 텍스트。",
		"Привет, мир! Ελληνικά κείμενα. עברית ועربية",
		"emoji 👍🏽👨‍👩‍👧 🇫🇷 and symbols ∑∫√ ✓",
		"\xff\xfe invalid \xc3\x28 utf-8 \xe2\x82",
		strings.Repeat("a", 1000), strings.Repeat("ab ", 400), strings.Repeat("🙂", 100),
		"supercalifragilisticexpialidocious-antidisestablishmentarianism_pneumonoultramicroscopic",
		"func main() {\n\tfmt.Println(\"hi\")\n}\n\n\n    indented    \t tabs",
	)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n\t.,;:'\"!?-_/\\()[]{}<>éüßçñøåæœ漢字かなカナ한글ДжЯ€£¥🙂👍")
	for range 300 {
		n := rng.IntN(400)
		var b strings.Builder
		for range n {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		texts = append(texts, b.String())
	}
	return texts
}

func TestCountMatchesTiktoken(t *testing.T) {
	enc := reference(t)
	for i, text := range corpus(t) {
		want := len(enc.EncodeOrdinary(text))
		if got := Count(text); got != want {
			t.Fatalf("text %d (%d bytes, %.60q): Count = %d, tiktoken-go %d", i, len(text), text, got, want)
		}
	}
}

func BenchmarkCount(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; 42 times, naïvely. ", 8)
	if err := Preload(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		Count(text)
	}
}

// TestMergeLongMatchesScan checks that the heap merge of long pieces joins
// pairs in the same order as tiktoken's scan: pieces of one repeated
// letter, of a few letters, of all kinds of bytes, and real words joined.
func TestMergeLongMatchesScan(t *testing.T) {
	if err := Preload(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	alphabets := []string{"a", "ab", "abc ", "etaoinshrdlu", "0123456789", "é漢🙂x", "\x00\xff\x80 q"}
	words := strings.Fields("the quick brown fox jumps over lazy dog token merge rank gateway billing")
	for i := range 400 {
		n := longPiece + 1 + rng.IntN(1500)
		var b strings.Builder
		if i%4 == 3 {
			for b.Len() < n {
				b.WriteString(words[rng.IntN(len(words))])
			}
		} else {
			alphabet := alphabets[rng.IntN(len(alphabets))]
			for b.Len() < n {
				b.WriteByte(alphabet[rng.IntN(len(alphabet))])
			}
		}
		piece := []byte(b.String())
		if got, want := vocab.mergeLong(piece), vocab.mergeScan(piece); got != want {
			t.Fatalf("piece %d (%d bytes, %.40q…): mergeLong %d, mergeScan %d", i, len(piece), piece, got, want)
		}
	}
}

// TestCountLongWords compares long single words, the pieces mergeLong
// takes, with tiktoken-go.
func TestCountLongWords(t *testing.T) {
	enc := reference(t)
	for _, text := range []string{
		strings.Repeat("a", 3000), strings.Repeat("é", 900), strings.Repeat("🙂", 300),
		strings.Repeat("Supercalifragilistic", 40), " " + strings.Repeat("xyzzy", 200),
	} {
		if got, want := Count(text), len(enc.EncodeOrdinary(text)); got != want {
			t.Fatalf("%.30q… (%d bytes): Count = %d, tiktoken-go %d", text, len(text), got, want)
		}
	}
}

// BenchmarkCountLongWord is one 64 KiB word, a piece the heap merge takes
// (2.6 s a call with the scan alone).
func BenchmarkCountLongWord(b *testing.B) {
	text := strings.Repeat("a", 64<<10)
	if err := Preload(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		Count(text)
	}
}
