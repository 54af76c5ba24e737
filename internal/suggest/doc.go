// Package suggest finds which known name a mistyped one most likely meant,
// for "unknown field "promt" (did you mean "prompt"?)" in config errors and
// in request errors of the plugin endpoints.
//
// It is one copy on purpose: config and plugins each had their own, which
// had drifted apart (bytes against runes, '-' against '_', how far a short
// name may be from its match).
package suggest
