-- The daily rollup by account, model and endpoint, for dashboards.
--
-- Why it is not a SummingMergeTree fed by a materialized view: a view sees
-- every INSERT, redelivered events included, and ClickHouse 18.16 cannot
-- deduplicate inserts into a table that is not replicated. A summed row
-- forgets which events it holds, so a double count could never be taken out
-- again, and billing must never count a call twice.
--
-- So the view copies each event's measures, keyed by its id, into
-- usage_daily_events, a ReplacingMergeTree: a redelivered event lands on the
-- key of its first copy, exactly as in usage_events, and FINAL keeps one.
-- usage_daily sums that table with FINAL and is exact at every moment. What
-- the copy buys over reading usage_events: only the measures, sorted by date
-- first, so a dashboard over a range of days reads a fraction of the bytes.
-- Invoices and other finance queries still read usage_events FINAL, the one
-- source of truth (queries.sql).
CREATE TABLE IF NOT EXISTS usage_daily_events
(
    date              Date,
    account           String,
    model             String,
    endpoint          String,
    id                String,
    prompt_tokens     Int64,
    cached_tokens     Int64,
    completion_tokens Int64,
    reasoning_tokens  Int64,
    images            Int64,
    cost_nanos        Int64,
    inserted_at       DateTime
)
ENGINE = ReplacingMergeTree(inserted_at)
PARTITION BY toYYYYMM(date)
ORDER BY (date, account, model, endpoint, id);

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_daily_mv TO usage_daily_events AS
SELECT date, account, model, endpoint, id,
       prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, images,
       cost_nanos, inserted_at
FROM usage_events;

-- Copy the events inserted before the view existed. An event copied both here
-- and by the view, or twice because this migration ran twice, is one row
-- under FINAL like any other duplicate.
INSERT INTO usage_daily_events
    (date, account, model, endpoint, id,
     prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, images,
     cost_nanos, inserted_at)
SELECT date, account, model, endpoint, id,
       prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, images,
       cost_nanos, inserted_at
FROM usage_events;

CREATE VIEW IF NOT EXISTS usage_daily AS
SELECT date, account, model, endpoint,
       count()                AS requests,
       sum(prompt_tokens)     AS prompt_tokens,
       sum(cached_tokens)     AS cached_tokens,
       sum(completion_tokens) AS completion_tokens,
       sum(reasoning_tokens)  AS reasoning_tokens,
       sum(images)            AS images,
       sum(cost_nanos)        AS cost_nanos
FROM usage_daily_events FINAL
GROUP BY date, account, model, endpoint;
