// Package accounts keeps accounts, their balances and their API keys in
// NATS JetStream KV, and verifies API keys (Ed25519-signed JWTs) without I/O.
//
// Every gateway watches both buckets into an in-memory snapshot, so a credit,
// a debit or a revocation made anywhere is seen everywhere within a second,
// and the request path (Verify, Balance, KeyInfo) never waits on NATS.
//
// The store is the last word on what a key may hold: CreateKey enforces
// MaxKeyNameLen and MaxRetentionDays for every caller. The admin API and
// the console check a request first with admin.CheckKeyRequest, which uses
// the same bounds, so a person is told which field to fix.
//
// Debits arrive from the other side of JetStream: the billing consumer
// (package billing) calls ApplyUsage, which remembers the stream sequences
// it charged, so a redelivered batch is never charged twice.
package accounts
