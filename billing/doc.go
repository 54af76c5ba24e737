// Package billing is the consumer side of metering: it reads usage events
// from the JetStream stream USAGE (written by package meter on the
// gateways), inserts them into ClickHouse and debits the accounts, then
// acknowledges them. The schema, its migrations and the finance queries
// are in billing/schema.
//
// Exactly-once comes from two idempotent steps rather than from the
// transport: ClickHouse keeps one row per event id under FINAL
// (ReplacingMergeTree), and a debit records the stream sequences it
// charged (accounts.ApplyUsage). Nothing is acknowledged before both have
// succeeded, so a crash anywhere means a redelivery, and a redelivery is
// harmless. Any number of billing processes may share the durable consumer
// ConsumerName.
//
// It runs in `tollgate billing`, or inside `tollgate serve` with
// clickhouse.consume_in_serve.
package billing
