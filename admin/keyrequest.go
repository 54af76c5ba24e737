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
			"logging retention must be a whole number of days from 0 to %d (0 keeps logged calls until deleted)", accounts.MaxRetentionDays)}
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
// invalid UTF-8 (stored as U+FFFD) and spaces at either end. A name is
// taken as sent, never trimmed: the console trimmed and the API did not,
// so each took names the other refused.
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
	}
	first, _ := utf8.DecodeRuneInString(name)
	last, _ := utf8.DecodeLastRuneInString(name)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return &Problem{"name", "name must not begin or end with a space"}
	}
	return nil
}
