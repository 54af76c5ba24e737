package admin

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/catalog"
)

// Problem is a request field a person has to fix. Field is the field's
// name in the admin API's JSON (the envelope's param); Message says what
// is wrong and what to send instead.
type Problem struct {
	Field   string
	Message string
}

// CheckKeyRequest checks a key request against the rules the admin API
// and the console share, and the live catalog, before it reaches the
// store. It is the one copy of those rules: each caller only turns its
// own input (JSON, a form) into req first.
func CheckKeyRequest(req accounts.KeyRequest, cat *catalog.Catalog) *Problem {
	if p := checkKeyName(req.Name); p != nil {
		return p
	}
	// Omitted means all; an empty list reads as "none" and would silently
	// make a key that may call everything.
	if req.Scopes != nil && len(req.Scopes) == 0 {
		return &Problem{"scopes", "scopes is an empty list: name at least one of " + strings.Join(accounts.AllScopes, ", ") + ", or omit scopes for all of them"}
	}
	if req.Models != nil && len(req.Models) == 0 {
		return &Problem{"models", "models is an empty list: name at least one catalog model, or omit models for every model"}
	}
	for _, sc := range req.Scopes {
		if !slices.Contains(accounts.AllScopes, sc) {
			return &Problem{"scopes", fmt.Sprintf("unknown scope %q; scopes are %s", sc, strings.Join(accounts.AllScopes, ", "))}
		}
	}
	for _, m := range req.Models {
		if _, ok := cat.Resolve(m); !ok {
			return &Problem{"models", fmt.Sprintf("model %q is not in the catalog; valid models: %s", m, cat.ValidList())}
		}
	}
	if req.RPM < 0 || req.TPM < 0 {
		return &Problem{"rpm", "rpm and tpm must not be negative"}
	}
	if days := req.Logging.RetentionDays; days < 0 || days > accounts.MaxRetentionDays {
		return &Problem{"logging.retention_days", fmt.Sprintf(
			"logging retention must be a whole number of days from 0 to %d (0 keeps logged calls with no expiry)", accounts.MaxRetentionDays)}
	}
	// The CLI refused -retention-days without -logging while the API
	// stored the days on a key that logs nothing.
	if days := req.Logging.RetentionDays; days != 0 && !req.Logging.Enabled {
		return &Problem{"logging.retention_days", fmt.Sprintf(
			"logging retention (retention_days: %d) applies only when logging is enabled: enable logging, or leave retention_days at 0", days)}
	}
	return nil
}

// checkKeyName refuses a name that would not show as it is wherever keys
// are listed: control characters (C0, DEL and C1), bidirectional
// formatting characters, which can show "x\u202egpj.exe" as "xexe.jpg",
// line and paragraph separators (U+2028, U+2029), characters that show
// as nothing (see invisibleInName), invalid UTF-8 (stored as U+FFFD) and
// spaces at either end. A name is taken as sent,
// never trimmed: the console trimmed and the API did not, so each took
// names the other refused.
func checkKeyName(name string) *Problem {
	isBidiControl := func(r rune) bool { return unicode.Is(unicode.Bidi_Control, r) }
	switch {
	case strings.TrimSpace(name) == "":
		return &Problem{"name", "name is required: name keys after where they are used, e.g. \"prod-backend\""}
	case len(name) > accounts.MaxKeyNameLen:
		return &Problem{"name", fmt.Sprintf("name is too long: at most %d bytes", accounts.MaxKeyNameLen)}
	case !utf8.ValidString(name):
		return &Problem{"name", "name must be valid UTF-8"}
	case strings.ContainsFunc(name, unicode.IsControl):
		return &Problem{"name", "name must not contain control characters"}
	case strings.ContainsFunc(name, isBidiControl):
		return &Problem{"name", "name must not contain bidirectional formatting characters (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069): they can make a name read as another"}
	case strings.ContainsFunc(name, isLineSeparator):
		return &Problem{"name", "name must not contain line or paragraph separators (U+2028, U+2029): a name is one line"}
	}
	if r, ok := invisibleInName(name); ok {
		return &Problem{"name", fmt.Sprintf("name must not contain invisible characters (it has %U): it would look like the name without them; a zero width joiner (U+200D) may only join two emoji, as in \U0001F469\u200d\U0001F4BB, and a variation selector U+FE0F or U+FE0E only follow one, as in \u2764\ufe0f", r)}
	}
	first, _ := utf8.DecodeRuneInString(name)
	last, _ := utf8.DecodeLastRuneInString(name)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return &Problem{"name", "name must not begin or end with a space"}
	}
	return nil
}

// invisibleInName returns the first character of name that shows as
// nothing, so that "prod\u200bbackend" lists as "prodbackend": a format
// character (category Cf: zero width space, zero width non-joiner, word
// joiner, byte order mark, soft hyphen, the tag characters), a variation
// selector, or another one Unicode says to ignore where it cannot be
// shown (the Hangul fillers, which count as letters, and the combining
// grapheme joiner). Two uses of them show: U+FE0F and U+FE0E right after
// a pictograph (Extended_Pictographic), which ask for its emoji or text
// form (or after a keycap's 0-9, # or *, before U+20E3), and the zero
// width joiner between two emoji, which joins them into one (woman,
// joiner, laptop: the technologist). An emoji is, near enough, a
// pictograph of the emoji planes (U+1Fxxx), or one followed by U+FE0F or
// a skin tone: "\u2605\u200d\u2605" (black stars, which have no emoji
// form) shows as two stars, the joiner as nothing.
func invisibleInName(name string) (rune, bool) {
	const zeroWidthJoiner = '\u200d'
	before := -1 // where the last character but skin tones and U+FE0F starts
	prev := rune(-1)
	for i, r := range name {
		rest := name[i+utf8.RuneLen(r):]
		switch {
		case r == zeroWidthJoiner:
			if before < 0 || !startsWithEmoji(name[before:]) || !startsWithEmoji(rest) {
				return r, true
			}
		case r == '\ufe0e' || r == '\ufe0f':
			next, _ := utf8.DecodeRuneInString(rest)
			keycap := strings.ContainsRune("0123456789#*", prev) && next == '\u20e3'
			if !unicode.Is(extendedPictographic, prev) && !keycap {
				return r, true
			}
		case unicode.In(r, unicode.Cf, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point):
			return r, true
		}
		if !isEmojiModifier(r) && r != '\ufe0f' {
			before = i
		}
		prev = r
	}
	return 0, false
}

// startsWithEmoji reports whether s starts with a pictograph shown as an
// emoji: one of the emoji planes, or one followed by U+FE0F (the emoji
// form) or a skin tone (see invisibleInName).
func startsWithEmoji(s string) bool {
	r, size := utf8.DecodeRuneInString(s)
	if !unicode.Is(extendedPictographic, r) {
		return false
	}
	next, _ := utf8.DecodeRuneInString(s[size:])
	return r >= 0x1F000 || next == '\ufe0f' || isEmojiModifier(next)
}

// isLineSeparator reports whether r is U+2028 or U+2029, which are not
// control characters but break a line where keys are listed as \n does.
func isLineSeparator(r rune) bool { return unicode.In(r, unicode.Zl, unicode.Zp) }

// isEmojiModifier reports whether r is one of the five skin tones
// (U+1F3FB to U+1F3FF), which follow a person emoji.
func isEmojiModifier(r rune) bool { return r >= 0x1F3FB && r <= 0x1F3FF }
