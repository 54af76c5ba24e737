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
