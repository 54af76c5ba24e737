-- request_logs: the inputs and outputs of keys with request logging on
-- (off by default). Rows arrive through the same outbox, stream and
-- consumer as usage_events, one per logged call, id = the usage event id.
--
-- Retention without TTL (ClickHouse 18.16 has none): each row carries the
-- day it expires, computed from its key's retention window when it is
-- written, and the table is partitioned by that day. The billing consumer
-- drops every partition whose day has passed (ALTER TABLE … DROP PARTITION,
-- hourly), which removes whole days of expired rows at no merge cost.
-- Rows of keys that keep logs forever expire on 2105-12-31, the last day a
-- Date holds. Duplicates from redelivery collapse on id like usage_events:
-- read FINAL.
CREATE TABLE IF NOT EXISTS request_logs
(
    id          String,
    time        DateTime('UTC'),
    expire_date Date,
    account     String,
    key_id      String,
    endpoint    String,
    model       String,
    stream      UInt8,
    status      UInt16,
    request     String,
    response    String,
    inserted_at DateTime DEFAULT now()
)
ENGINE = ReplacingMergeTree(inserted_at)
PARTITION BY toYYYYMMDD(expire_date)
ORDER BY (account, time, id);
