-- usage_events: one row per billable call, field for field a meter.Event.
--
-- The billing consumer may insert an event more than once: JetStream
-- redelivers a message whose ack was lost after the INSERT succeeded.
-- ReplacingMergeTree keeps one row per sorting key, and every column of the
-- key is a function of the event alone (date is derived from time in UTC, not
-- from the server's zone or the insert time), so a redelivered event lands on
-- the key of its first copy. Duplicates disappear only when parts merge, at a
-- time ClickHouse picks: everything that must be exact reads FROM usage_events
-- FINAL. The partition is a function of the event too, which FINAL relies on:
-- it never merges across partitions.
--
-- Money is cost_nanos, integer nano-USD (money.Nanos). Durations are whole
-- microseconds. No DateTime64, LowCardinality or TTL: the schema runs on
-- ClickHouse 18.16 as well as on current releases.
CREATE TABLE IF NOT EXISTS usage_events
(
    id                String,
    time              DateTime('UTC'),
    date              Date DEFAULT toDate(time, 'UTC'),
    account           String,
    key_id            String,
    endpoint          String,
    model             String,
    upstream          String,
    prompt_tokens     Int64,
    cached_tokens     Int64,
    completion_tokens Int64,
    reasoning_tokens  Int64,
    images            Int64,
    cost_nanos        Int64,
    usage_source      String,
    status            UInt16,
    latency_us        UInt64,
    ttfb_us           UInt64,
    stream            UInt8,
    job_id            String,
    inserted_at       DateTime DEFAULT now()
)
ENGINE = ReplacingMergeTree(inserted_at)
PARTITION BY toYYYYMM(date)
ORDER BY (account, date, id);
