// Package schema is the ClickHouse side of billing: the schema as numbered
// SQL migrations embedded in the binary, the runner that applies them, and
// the finance queries of queries.sql.
//
// It lives beside the billing consumer rather than under deploy/ because it
// is runtime code: the binary embeds the .sql files here, `tollgate migrate`
// and the consumer apply them, and `tollgate finance` runs the queries.
// deploy/ keeps only what operators copy (configs, units, dashboards).
//
// Everything here runs on ClickHouse 18.16 (Debian's) and on current
// releases, over the native protocol. A migration must be harmless to run
// twice (IF NOT EXISTS; copies into ReplacingMergeTree tables): several
// processes may migrate at once.
package schema
