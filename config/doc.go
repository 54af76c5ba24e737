// Package config holds the schema of gateway.yaml, its loader (environment
// expansion, strict decoding, validation with line numbers) and hot reload.
//
// Reload builds the new world first (see Watcher): the file is parsed and
// validated whole, then handed to the caller's build step, and only then
// swapped in. A change to a setting read once at start (marked
// restart-only here and RESTART-ONLY in gateway.yaml; RestartOnlyDiff is
// the list) is refused by name and the running config stays, rather than
// reported as applied while the process keeps the old value. Typos in
// field names get a "did you mean" from internal/suggest.
package config
