// Package meter is the gateway side of metering: the usage event, the
// Recorder the proxy hands events to, the durable outbox behind it and the
// publisher that moves the outbox into the JetStream stream USAGE.
//
// It stops at JetStream. What reads USAGE (the billing consumer, the
// ClickHouse sink, the schema, the debits) is package billing, on the other
// side of the stream, so a gateway's metering depends on neither the
// account store nor ClickHouse: the two sides share only Event, the stream's
// name and subjects, and the batch format (NDJSON, one event per line).
//
// The request path calls Record or RecordDurable, which copy the event into
// the memory-mapped outbox under a short lock; NATS is never waited on
// there. See outbox.go for the on-disk format and durability levels, and
// publisher.go for batching and deduplication.
package meter
