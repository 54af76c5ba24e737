package main

import (
	"fmt"

	"github.com/tollgate/tollgate/meter"
)

// metricsText renders the usage pipeline's counters in the Prometheus text
// format for GET /metrics.
func metricsText(st meter.PublisherStats) []byte {
	return fmt.Appendf(nil, `# HELP tollgate_outbox_depth Usage events not yet acknowledged by JetStream.
# TYPE tollgate_outbox_depth gauge
tollgate_outbox_depth %d
# HELP tollgate_outbox_bytes Bytes held by the usage outbox on disk.
# TYPE tollgate_outbox_bytes gauge
tollgate_outbox_bytes %d
# HELP tollgate_usage_published_total Usage events acknowledged by JetStream.
# TYPE tollgate_usage_published_total counter
tollgate_usage_published_total %d
# HELP tollgate_usage_duplicates_total Republished events JetStream recognised as duplicates.
# TYPE tollgate_usage_duplicates_total counter
tollgate_usage_duplicates_total %d
# HELP tollgate_usage_publish_failures_total Failed publish attempts (retried).
# TYPE tollgate_usage_publish_failures_total counter
tollgate_usage_publish_failures_total %d
# HELP tollgate_usage_dropped_total Usage events the outbox refused (logged for manual billing).
# TYPE tollgate_usage_dropped_total counter
tollgate_usage_dropped_total %d
# HELP tollgate_usage_publish_latency_seconds Latency of the last acknowledged publish.
# TYPE tollgate_usage_publish_latency_seconds gauge
tollgate_usage_publish_latency_seconds %.6f
`, st.OutboxDepth, st.OutboxBytes, st.Published, st.Duplicates, st.Failures, st.Dropped, st.LastPublishLatency.Seconds())
}
