package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
)

// metricsText renders the usage pipeline's counters in the Prometheus text
// format for GET /metrics.
func metricsText(st meter.PublisherStats) []byte {
	return fmt.Appendf(nil, `# HELP tollgate_outbox_depth Usage events not yet acknowledged by JetStream.
# TYPE tollgate_outbox_depth gauge
tollgate_outbox_depth %d
# HELP tollgate_outbox_bytes Bytes of usage events (and segment headers) the outbox holds, counted against billing.outbox_max_bytes; its segment files on disk are allocated whole, larger.
# TYPE tollgate_outbox_bytes gauge
tollgate_outbox_bytes %d
# HELP tollgate_usage_published_total Usage events JetStream holds that this process published or found stored already; new ones are this less tollgate_usage_duplicates_total.
# TYPE tollgate_usage_published_total counter
tollgate_usage_published_total %d
# HELP tollgate_usage_duplicates_total Usage events JetStream held already when this process came to publish them: sent again and recognised as duplicates, or skipped because the start-up look-up found them stored.
# TYPE tollgate_usage_duplicates_total counter
tollgate_usage_duplicates_total %d
# HELP tollgate_usage_publish_failures_total Failed publish attempts and failed outbox writes to disk (a spare segment, the acked file); each is retried.
# TYPE tollgate_usage_publish_failures_total counter
tollgate_usage_publish_failures_total %d
# HELP tollgate_usage_dropped_total Usage events the outbox refused (logged for manual billing).
# TYPE tollgate_usage_dropped_total counter
tollgate_usage_dropped_total %d
# HELP tollgate_usage_publish_latency_seconds Latency of the last acknowledged publish.
# TYPE tollgate_usage_publish_latency_seconds gauge
tollgate_usage_publish_latency_seconds %.6f
# HELP tollgate_nats_connected 1 while the connection to NATS is up; while it is down nothing is published (no failures are counted) and the outbox grows.
# TYPE tollgate_nats_connected gauge
tollgate_nats_connected %d
`, st.OutboxDepth, st.OutboxBytes, st.Published, st.Duplicates, st.Failures, st.Dropped, st.LastPublishLatency.Seconds(), boolGauge(st.Connected))
}

// reloadMetrics renders the outcome and time of the config's last reload
// attempt: a failed one keeps the old config serving, and only the log
// said so.
func reloadMetrics(w *config.Watcher) []byte {
	ok, at := w.LastReload()
	return fmt.Appendf(nil, `# HELP tollgate_config_last_reload_success 1 when the last reload of gateway.yaml (a change seen, or SIGHUP) was applied, 0 when it was refused and the config before it still serves (the log says why), until a reload applies or the file is the config in force again.
# TYPE tollgate_config_last_reload_success gauge
tollgate_config_last_reload_success %d
# HELP tollgate_config_last_reload_timestamp_seconds When the last reload of gateway.yaml was attempted, successful or not (Unix time); the start until the first.
# TYPE tollgate_config_last_reload_timestamp_seconds gauge
tollgate_config_last_reload_timestamp_seconds %.3f
`, boolGauge(ok), float64(at.UnixMilli())/1000)
}

// storeMetrics renders whether the embedded JetStream's store takes
// writes; nothing with an external NATS, whose store is its operator's
// to watch. A store that failed a write (a full disk) refused every later
// one, and the outbox growing while tollgate_nats_connected was 1 was the
// only sign on /metrics.
func storeMetrics(b *broker.Broker) []byte {
	if !b.Embedded() {
		return nil
	}
	return fmt.Appendf(nil, `# HELP tollgate_nats_store_writable 1 while the embedded JetStream's store (data_dir/nats) takes writes; 0 while a stream of it refuses every write after a write error (a full disk), until the gateway restarts JetStream once the disk has room (the log names the streams).
# TYPE tollgate_nats_store_writable gauge
tollgate_nats_store_writable %d
`, boolGauge(b.StoreError() == nil))
}

func boolGauge(b bool) int {
	if b {
		return 1
	}
	return 0
}

// billingBacklog renders how many usage messages (batches of events) the
// billing consumer has not acknowledged: waiting in JetStream, or
// delivered and not yet inserted and debited. Wherever the consumer runs,
// every gateway can ask; it grows while ClickHouse or the consumer is
// down, which nothing else on /metrics showed. Billing makes its consumer
// once ClickHouse is reached; before that every message of the stream is
// the backlog, since the consumer delivers the whole stream from its
// first (DeliverAllPolicy). Nothing when JetStream does not answer within
// a second, or there is no stream yet.
func billingBacklog(js jetstream.JetStream) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var backlog uint64
	cons, err := js.Consumer(ctx, meter.UsageStream, billing.ConsumerName)
	switch {
	case err == nil:
		info := cons.CachedInfo() // as fetched by js.Consumer
		backlog = info.NumPending + uint64(info.NumAckPending)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		stream, err := js.Stream(ctx, meter.UsageStream)
		if err != nil {
			return nil
		}
		backlog = stream.CachedInfo().State.Msgs
	default:
		return nil
	}
	return fmt.Appendf(nil, `# HELP tollgate_billing_backlog_messages Usage messages (batches of events) the billing consumer has not acknowledged yet (the whole stream before billing first reached ClickHouse): growing, ClickHouse or the consumer is down.
# TYPE tollgate_billing_backlog_messages gauge
tollgate_billing_backlog_messages %d
`, backlog)
}

// backlogTTL is how long a billing backlog read serves scrapes.
const backlogTTL = time.Second

// backlogCache answers scrapes with the billing backlog read at most
// backlogTTL ago: each read is a JetStream request, and 16 connections
// scraping /metrics as fast as they could halved the gateway's chat
// throughput. A gauge a second old is what a scrape every few seconds
// sees anyway.
type backlogCache struct {
	read func() []byte // billingBacklog, or a test's stand-in
	mu   sync.Mutex    // held across the read: concurrent scrapes wait for one read
	at   time.Time     // when text was read; zero before the first
	text []byte
}

func newBacklogCache(js jetstream.JetStream) *backlogCache {
	return &backlogCache{read: func() []byte { return billingBacklog(js) }}
}

// Text is the backlog's series, read again when the last read is
// backlogTTL old. Safe for concurrent use; the caller must not modify
// what it returns.
func (c *backlogCache) Text() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || time.Since(c.at) >= backlogTTL {
		c.text = c.read()
		c.at = time.Now() // after the read: a slow one is not read again at once
	}
	return c.text
}
