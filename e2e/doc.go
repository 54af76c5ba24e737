// Package e2e runs the built tollgate binary as real processes — gateways
// and billing consumers — against real NATS (each gateway's embedded server,
// or an in-process three-node cluster), a private ClickHouse and a fake
// upstream, and checks that metering stays exact through crashes: every
// answer a client received whole is billed once, to the token and to the
// nano-dollar, and balances are debited exactly once.
//
// The package holds only tests; `go test ./e2e` builds ./cmd/tollgate first.
package e2e
