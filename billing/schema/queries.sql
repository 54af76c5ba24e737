-- Finance queries over usage_events (and one over request_logs). Every
-- query reads FINAL, which drops redelivered copies of an event, so the
-- numbers are exact at any moment.
--
-- Parameters are written {name:Type}. Current clickhouse-client binds them
-- itself: --param_name=value. ClickHouse 18.16 has no query parameters:
-- replace each one by a literal first, a String by 'acme', a Date by
-- toDate('2025-01-01'). Days are UTC days. Ranges are half-open: from_date is
-- included, to_date is not. A Date holds 1970-01-01 to 2105-12-31 (ClickHouse
-- 18.16 reads any other day as 0000-00-00, matching nothing); tollgate finance
-- refuses days outside it, except a from_date before it, bound as
-- 1970-01-01, and a to_date after it (9999-12-31 for "to the end"), bound as
-- (toDate('2105-12-31') + 1), the day after. The invoice finds its month with
-- toStartOfMonth(date) rather than date < addMonths(...), which makes the
-- month after December 2105 0000-00-00.
--
-- Money: spend_nanos is the exact integer in nano-USD; spend_usd shows it as
-- a decimal string with nine places, built with integer division so no
-- floating point ever touches it.
--
-- No alias repeats the name of a column it reads: ClickHouse resolves names
-- to aliases first, and versions differ in what they make of sum(x) AS x.
--
-- Each query starts with a "-- name:" line; the Go package billing/schema finds
-- queries by those names (FinanceQuery) and its tests run every one of them.

-- name: spend_per_account_per_day
-- Spend of every account on each UTC day from {from_date} up to {to_date}, which is not included.
SELECT
    date,
    account,
    count() AS requests,
    sum(cost_nanos) AS spend_nanos,
    concat(if(spend_nanos < 0, '-', ''),
           toString(intDiv(abs(spend_nanos), 1000000000)), '.',
           substring(toString(1000000000 + abs(spend_nanos) % 1000000000), 2)) AS spend_usd
FROM usage_events FINAL
WHERE date >= {from_date:Date} AND date < {to_date:Date}
GROUP BY date, account
ORDER BY date, account;

-- name: spend_per_account_per_month
-- Spend of every account in each calendar month (UTC) from {from_date} up to
-- {to_date} (not included); pass first days of months to get whole months.
SELECT
    toStartOfMonth(date) AS month,
    account,
    count() AS requests,
    sum(cost_nanos) AS spend_nanos,
    concat(if(spend_nanos < 0, '-', ''),
           toString(intDiv(abs(spend_nanos), 1000000000)), '.',
           substring(toString(1000000000 + abs(spend_nanos) % 1000000000), 2)) AS spend_usd
FROM usage_events FINAL
WHERE date >= {from_date:Date} AND date < {to_date:Date}
GROUP BY month, account
ORDER BY month, account;

-- name: tokens_and_cost_per_model
-- Tokens and spend per model and endpoint, all accounts together, from
-- {from_date} up to {to_date} (not included), biggest spend first. A model's
-- calls to /v1/classify, /v1/tag, /v1/score, /v1/match and /v1/batch are
-- priced at plugins.pricing or batch.price_per_token, or at the model's own
-- prices for the tokens the model spent when those come higher: only its
-- lines of /v1/chat/completions and /v1/responses are the model's prices
-- alone.
SELECT
    model,
    endpoint,
    count() AS requests,
    sum(prompt_tokens) AS prompt,
    sum(cached_tokens) AS cached,
    sum(completion_tokens) AS completion,
    sum(reasoning_tokens) AS reasoning,
    sum(images) AS image_count,
    sum(cost_nanos) AS spend_nanos,
    concat(if(spend_nanos < 0, '-', ''),
           toString(intDiv(abs(spend_nanos), 1000000000)), '.',
           substring(toString(1000000000 + abs(spend_nanos) % 1000000000), 2)) AS spend_usd
FROM usage_events FINAL
WHERE date >= {from_date:Date} AND date < {to_date:Date}
GROUP BY model, endpoint
ORDER BY spend_nanos DESC, model, endpoint;

-- name: top_keys_by_spend
-- The 50 API keys that spent most from {from_date} up to {to_date} (not included), with their
-- account; change LIMIT for more.
SELECT
    key_id,
    account,
    count() AS requests,
    sum(cost_nanos) AS spend_nanos,
    concat(if(spend_nanos < 0, '-', ''),
           toString(intDiv(abs(spend_nanos), 1000000000)), '.',
           substring(toString(1000000000 + abs(spend_nanos) % 1000000000), 2)) AS spend_usd
FROM usage_events FINAL
WHERE date >= {from_date:Date} AND date < {to_date:Date}
GROUP BY key_id, account
ORDER BY spend_nanos DESC, key_id
LIMIT 50;

-- name: invoice
-- The invoice of account {account} for the calendar month (UTC) holding
-- {month}, any day of it: one line per model and endpoint with requests,
-- tokens and spend, then a last line, model TOTAL, summing all lines. A
-- batch job is one request, however many rows it billed (one per stop and
-- its completion's, all with its job_id; only batch rows have one), in
-- each month it billed in.
SELECT
    model,
    endpoint,
    requests,
    prompt AS prompt_tokens,
    cached AS cached_tokens,
    completion AS completion_tokens,
    reasoning AS reasoning_tokens,
    image_count AS images,
    spend_nanos,
    concat(if(spend_nanos < 0, '-', ''),
           toString(intDiv(abs(spend_nanos), 1000000000)), '.',
           substring(toString(1000000000 + abs(spend_nanos) % 1000000000), 2)) AS spend_usd
FROM
(
    SELECT
        toUInt8(0) AS is_total,
        model,
        endpoint,
        countIf(job_id = '') + uniqExactIf(job_id, job_id != '') AS requests,
        sum(prompt_tokens) AS prompt,
        sum(cached_tokens) AS cached,
        sum(completion_tokens) AS completion,
        sum(reasoning_tokens) AS reasoning,
        sum(images) AS image_count,
        sum(cost_nanos) AS spend_nanos
    FROM usage_events FINAL
    WHERE account = {account:String}
      AND date >= toStartOfMonth({month:Date})
      AND toStartOfMonth(date) = toStartOfMonth({month:Date})
    GROUP BY model, endpoint
    UNION ALL
    SELECT
        toUInt8(1) AS is_total,
        'TOTAL' AS model,
        '' AS endpoint,
        countIf(job_id = '') + uniqExactIf(job_id, job_id != '') AS requests,
        sum(prompt_tokens) AS prompt,
        sum(cached_tokens) AS cached,
        sum(completion_tokens) AS completion,
        sum(reasoning_tokens) AS reasoning,
        sum(images) AS image_count,
        sum(cost_nanos) AS spend_nanos
    FROM usage_events FINAL
    WHERE account = {account:String}
      AND date >= toStartOfMonth({month:Date})
      AND toStartOfMonth(date) = toStartOfMonth({month:Date})
)
ORDER BY is_total, model, endpoint;

-- name: request_logs
-- The logged inputs and outputs of key {key_id} (keys created with logging)
-- from {from_date} up to {to_date} (not included), newest first, at most {max_rows} rows. A
-- streamed call's response is the text it relayed, joined.
SELECT
    time,
    id,
    endpoint,
    model,
    stream,
    status,
    request,
    response
FROM request_logs FINAL
WHERE key_id = {key_id:String}
  AND time >= toDateTime({from_date:Date}, 'UTC') AND time < toDateTime({to_date:Date}, 'UTC')
-- time is whole seconds; ids are UUIDv7, in the calls' order within one
ORDER BY time DESC, id DESC
LIMIT {max_rows:UInt32};
