// Package jsoncheck holds the checks client JSON passes before the
// gateway reads it with gjson, shared by the generation path, the plugin
// endpoints and batch lines: how deeply it nests, and whether an object
// names a key twice.
package jsoncheck

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// MaxDepth is the deepest nesting accepted, encoding/json's own limit: far
// beyond any real request (a tool's JSON schema nests a few dozen deep),
// and shallow enough that validating costs a few MiB of stack at most.
const MaxDepth = 10000

// TooDeep reports whether data nests arrays and objects more than limit
// deep. gjson validates them recursively, so a body of a few million '['
// overflows the goroutine's stack, and a stack overflow ends the whole
// process, not one request. Brackets inside strings do not count. It costs two vectorised
// counts for any text with fewer brackets than limit, which is every real
// one, and one byte-by-byte pass otherwise.
func TooDeep(data []byte, limit int) bool {
	if bytes.Count(data, []byte{'['})+bytes.Count(data, []byte{'{'}) <= limit {
		return false
	}
	depth := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			if depth++; depth > limit {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}

// DuplicateMember returns a key obj names more than once, or "": encoding/json
// keeps the last of two, gjson finds the first, and a client that sent two
// cannot know which was read.
func DuplicateMember(obj gjson.Result) string {
	var keys Keys
	dup := ""
	obj.ForEach(func(key, _ gjson.Result) bool {
		if keys.Seen(key) {
			dup = key.Str
			return false
		}
		return true
	})
	return dup
}

// DuplicateDecodedMember is DuplicateMember for an object Go will decode
// into a map: keys compare as encoding/json decodes them, each lone
// surrogate escape and each byte that is not UTF-8 read as U+FFFD. So
// "x\ud800" and "x\udc00", two keys to Python and to DuplicateMember,
// are one to the map, which kept the last silently. It returns the key
// as decoded.
func DuplicateDecodedMember(obj gjson.Result) string {
	var keys Keys
	dup := ""
	obj.ForEach(func(key, _ gjson.Result) bool {
		if k := decodedKey(key); keys.seen(k) {
			dup = k
			return false
		}
		return true
	})
	return dup
}

// decodedKey is key's text as encoding/json decodes it.
func decodedKey(key gjson.Result) string {
	raw := key.Raw
	if strings.IndexByte(raw, '\\') < 0 && utf8.ValidString(raw) {
		return key.Str // no allocation: the usual key
	}
	var s string
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return key.Str // not a JSON string: gjson's reading is all there is
	}
	return s
}

// Keys tells the keys of one object named twice, fed one at a time, for a
// caller that walks the object's members for its own reasons too. The
// zero value is empty. The keys of an object of a few dozen members, the
// usual case, are compared without allocating; past that a map keeps a
// hostile object of a million keys linear (compared pairwise, a request
// body of 100,000 keys took 20 s of CPU).
type Keys struct {
	small [32]string
	n     int
	many  map[string]struct{}
}

// Seen reports whether key, a member's key as gjson's ForEach gives it,
// was fed before, and notes it. Keys are compared as Python's json reads
// them (the upstreams, vLLM and SGLang, are written in it): "a" and
// "\u0061" are one key, "\ud800" and "\udc00" two (see pythonKey).
func (k *Keys) Seen(key gjson.Result) bool {
	return k.seen(pythonKey(key))
}

func (k *Keys) seen(key string) bool {
	if k.many == nil {
		for _, s := range k.small[:k.n] {
			if s == key {
				return true
			}
		}
		if k.n < len(k.small) {
			k.small[k.n] = key
			k.n++
			return false
		}
		k.many = make(map[string]struct{}, 2*len(k.small))
		for _, s := range k.small {
			k.many[s] = struct{}{}
		}
	}
	if _, ok := k.many[key]; ok {
		return true
	}
	k.many[key] = struct{}{}
	return false
}

// pythonKey is key's text as Python's json decodes it. That is gjson's
// Str, except where the key escapes a lone surrogate: gjson reads every
// one as U+FFFD (and takes whatever escape follows a high surrogate as
// its pair), so {"\ud800":1,"\udc00":2} was refused as a duplicate key
// though Python keeps the two. Such a key is decoded here with each lone
// surrogate kept as its own code point, written as WTF-8 (the three bytes
// UTF-8 would give it): distinct keys stay distinct, and one spelled two
// ways ("\ud83d\ude00" and "😀") is still one.
func pythonKey(key gjson.Result) string {
	raw := key.Raw
	if len(raw) < 2 || raw[0] != '"' || strings.IndexByte(raw, '\\') < 0 || !escapesSurrogate(raw) {
		return key.Str // no allocation: the usual key has no escape at all
	}
	return decodeKeepingSurrogates(raw[1 : len(raw)-1])
}

// escapesSurrogate reports whether the JSON string raw holds a \u escape
// of a surrogate (U+D800 to U+DFFF).
func escapesSurrogate(raw string) bool {
	for i := 0; i < len(raw)-1; i++ {
		if raw[i] != '\\' {
			continue
		}
		if r, ok := hexRune(raw[i+2:]); raw[i+1] == 'u' && ok && utf16.IsSurrogate(r) {
			return true
		}
		i++ // the escaped character, which may be a backslash
	}
	return false
}

// LoneSurrogate reports whether valid JSON data escapes a lone surrogate
// in a string: "\ud800" not followed by a low surrogate's escape, or a
// low one ("\udc00") not after a high one. Such an escape is no
// character; encoding/json and gjson read it as U+FFFD, so a name sent
// with one was stored as another than the one sent. data is a body, or
// one string of it as gjson gives it (Raw).
func LoneSurrogate[T string | []byte](data T) bool {
	for i := 0; i < len(data)-1; i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := hexRune(string(data[i+2 : min(i+6, len(data))]))
		if data[i+1] != 'u' || !ok || !utf16.IsSurrogate(r) {
			i++ // the escaped character, which may be a backslash
			continue
		}
		if r >= 0xDC00 {
			return true // a low surrogate with no high one before it
		}
		i += 6
		if i+1 >= len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return true
		}
		if low, ok := hexRune(string(data[i+2 : min(i+6, len(data))])); !ok || low < 0xDC00 || low > 0xDFFF {
			return true
		}
		i += 5 // past the pair
	}
	return false
}

// decodeKeepingSurrogates decodes the body of a JSON string as Python's
// json does, writing a lone surrogate as WTF-8.
func decodeKeepingSurrogates(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		if s[i] != '\\' || i+1 == len(s) {
			b = append(b, s[i])
			i++
			continue
		}
		e := s[i+1]
		r, ok := hexRune(s[i+2:])
		if e != 'u' || !ok {
			if j := strings.IndexByte(`"\/bfnrt`, e); j >= 0 {
				e = "\"\\/\b\f\n\r\t"[j]
			}
			b = append(b, e) // past the list, not valid JSON: kept as it is
			i += 2
			continue
		}
		i += 6
		if 0xD800 <= r && r < 0xDC00 && i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
			if low, ok := hexRune(s[i+2:]); ok && 0xDC00 <= low && low <= 0xDFFF {
				r = utf16.DecodeRune(r, low)
				i += 6
			}
		}
		if utf16.IsSurrogate(r) {
			b = append(b, 0xE0|byte(r>>12), 0x80|byte(r>>6&0x3F), 0x80|byte(r&0x3F))
			continue
		}
		b = utf8.AppendRune(b, r)
	}
	return string(b)
}

// hexRune reads the four hex digits s starts with, those of a \u escape.
func hexRune(s string) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[:4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// Kind words what a JSON value is, as OpenAI's type errors do ("a
// string", "a boolean", "null"), for messages that say what was sent.
func Kind(v gjson.Result) string {
	switch {
	case v.Type == gjson.String:
		return "a string"
	case v.Type == gjson.Number:
		return "a number"
	case v.Type == gjson.True || v.Type == gjson.False:
		return "a boolean"
	case v.IsArray():
		return "an array"
	case v.IsObject():
		return "an object"
	}
	return "null"
}

// UTF16Encoding names the UTF-16 encoding data is in ("" for none): by
// its byte order mark, or, without one, by the NUL beside its first
// character, JSON's first character being ASCII. Windows tools write
// UTF-16 (PowerShell 5's > and Out-File), and a parser reads it as
// JSON that is not valid, which named no reason a user could act on.
func UTF16Encoding(data []byte) string {
	switch {
	case bytes.HasPrefix(data, []byte{0xff, 0xfe}), len(data) >= 2 && data[0] != 0 && data[1] == 0:
		return "UTF-16 little-endian"
	case bytes.HasPrefix(data, []byte{0xfe, 0xff}), len(data) >= 2 && data[0] == 0 && data[1] != 0:
		return "UTF-16 big-endian"
	}
	return ""
}

// UTF8BOM starts the files many Windows tools write (Notepad,
// PowerShell's Out-File -Encoding utf8); JSON has no place for it.
var UTF8BOM = []byte("\xef\xbb\xbf")
