package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// settleTimeout bounds waiting for billing to catch up after the load. It
// is long because a billing process killed with a batch in hand leaves
// that batch unacknowledged, and JetStream hands it out again only after
// the consumer's AckWait (60 s).
const settleTimeout = 150 * time.Second

// ledger reads what billing recorded: ClickHouse's usage_events and the
// USAGE stream with its billing consumer.
type ledger struct {
	t  *testing.T
	ch driver.Conn
	nc *nats.Conn
	js jetstream.JetStream
}

// openLedger connects to ClickHouse at dsn and to NATS at natsURL (one URL
// or a comma-separated list).
func openLedger(t *testing.T, dsn, natsURL string) *ledger {
	t.Helper()
	opts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatalf("opening ClickHouse at %s: %v", dsn, err)
	}
	t.Cleanup(func() { ch.Close() })
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("connecting to NATS at %s: %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &ledger{t: t, ch: ch, nc: nc, js: js}
}

// settle waits until everything the gateways took is billed: their
// outboxes are empty (JetStream has every event) and the billing consumer
// has nothing undelivered or unacknowledged (it acks only after the INSERT
// and the debit). Then ClickHouse must hold, under FINAL, one row per
// event in the stream's messages; more events than rows means an event
// was stored in the stream twice (a batch published twice under another
// id), and so debited twice.
func (l *ledger) settle(gateways ...*gateway) {
	l.t.Helper()
	began := time.Now()
	var last string
	checkFor(l.t, settleTimeout, 250*time.Millisecond, func() error {
		for _, g := range gateways {
			depth, err := g.outboxDepth()
			if err != nil {
				return err
			}
			if depth != 0 {
				return fmt.Errorf("%s: tollgate_outbox_depth %d", g.name, depth)
			}
		}
		info, err := l.consumerInfo()
		if err != nil {
			return err
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			state := fmt.Sprintf("billing consumer: %d messages not delivered, %d not acknowledged (redelivered %d)", info.NumPending, info.NumAckPending, info.NumRedelivered)
			if state != last {
				l.t.Logf("settling after %v: %s", time.Since(began).Round(time.Second), state)
				last = state
			}
			return errors.New(state)
		}
		return nil
	})
	l.t.Logf("billing settled %v after the load", time.Since(began).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := l.js.Stream(ctx, meter.UsageStream)
	if err != nil {
		l.t.Fatal(err)
	}
	sinfo, err := stream.Info(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	var rows uint64
	if err := l.ch.QueryRow(ctx, "SELECT count() FROM usage_events FINAL").Scan(&rows); err != nil {
		l.t.Fatalf("ClickHouse: %v", err)
	}
	if events := l.streamEvents(ctx, stream, sinfo.State.Msgs); rows != events {
		l.t.Errorf("the USAGE stream holds %d events in %d messages, ClickHouse %d events under FINAL: events were stored in the stream more than once (JetStream deduplication by Nats-Msg-Id failed) and are debited once per copy", events, sinfo.State.Msgs, rows)
	}
}

// streamEvents counts the events (lines) of the stream's msgs messages.
func (l *ledger) streamEvents(ctx context.Context, stream jetstream.Stream, msgs uint64) uint64 {
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		l.t.Fatal(err)
	}
	var events uint64
	for read := uint64(0); read < msgs; {
		batch, err := cons.Fetch(int(min(500, msgs-read)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			l.t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			events += uint64(bytes.Count(msg.Data(), []byte("\n")) + 1)
			n++
		}
		if n == 0 {
			l.t.Fatalf("read %d of %d stream messages, then nothing: %v", read, msgs, batch.Error())
		}
		read += uint64(n)
	}
	return events
}

func (l *ledger) consumerInfo() (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := l.js.Consumer(ctx, meter.UsageStream, billing.ConsumerName)
	if err != nil {
		return nil, fmt.Errorf("billing consumer: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("billing consumer: %w", err)
	}
	return info, nil
}

// billed is one usage_events row.
type billed struct {
	prompt, completion, cost int64
	source                   string
}

// events returns the account's rows under FINAL by id, checking that FINAL
// leaves one row per id and that count() FINAL agrees.
func (l *ledger) events(account string) map[string]billed {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := l.ch.Query(ctx, "SELECT id, prompt_tokens, completion_tokens, cost_nanos, usage_source FROM usage_events FINAL WHERE account = ?", account)
	if err != nil {
		l.t.Fatalf("ClickHouse: %v", err)
	}
	defer rows.Close()
	out := map[string]billed{}
	n := 0
	for rows.Next() {
		var id string
		var b billed
		if err := rows.Scan(&id, &b.prompt, &b.completion, &b.cost, &b.source); err != nil {
			l.t.Fatalf("ClickHouse: %v", err)
		}
		out[id] = b
		n++
	}
	if err := rows.Err(); err != nil {
		l.t.Fatalf("ClickHouse: %v", err)
	}
	if n != len(out) {
		l.t.Errorf("usage_events FINAL holds %d rows for %s but %d distinct ids", n, account, len(out))
	}
	var count uint64
	if err := l.ch.QueryRow(ctx, "SELECT count() FROM usage_events FINAL WHERE account = ?", account).Scan(&count); err != nil {
		l.t.Fatalf("ClickHouse: %v", err)
	}
	if count != uint64(len(out)) {
		l.t.Errorf("count() FINAL of %s is %d, distinct ids %d", account, count, len(out))
	}
	return out
}

// sumCost is sum(cost_nanos) FINAL of the account, as finance reads it.
func (l *ledger) sumCost(account string) money.Nanos {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sum int64
	if err := l.ch.QueryRow(ctx, "SELECT sum(cost_nanos) FROM usage_events FINAL WHERE account = ?", account).Scan(&sum); err != nil {
		l.t.Fatalf("ClickHouse: %v", err)
	}
	return money.Nanos(sum)
}

// checkBilled asserts that billing agrees with what the clients saw:
// every completed answer is in ClickHouse with exactly the call's tokens
// and cost, at most maxExtra events exist beyond them (answers billed
// whose client never got them whole, which only a killed gateway can
// cause), and the account was debited exactly sum(cost_nanos) FINAL.
func checkBilled(t *testing.T, l *ledger, g *gateway, account string, credit, perCall money.Nanos, res *loadResult, maxExtra int) {
	t.Helper()
	rows := l.events(account)
	completed, failed := res.counts()
	t.Logf("clients: %s; ClickHouse: %d events of %s", res.summary(), len(rows), account)
	if completed == 0 {
		t.Fatal("no answer completed: the load did not run")
	}

	var missing, wrong, extra []string
	var prompt, completion, cost int64
	for id := range res.completed {
		b, ok := rows[id]
		if !ok {
			missing = append(missing, id)
			continue
		}
		prompt += b.prompt
		completion += b.completion
		cost += b.cost
		if b.prompt != loadPromptTokens || b.completion != loadCompletionTokens || money.Nanos(b.cost) != perCall {
			wrong = append(wrong, fmt.Sprintf("%s: %d+%d tokens, %s USD (%s)", id, b.prompt, b.completion, money.Nanos(b.cost), b.source))
		}
	}
	for id, b := range rows {
		if !res.completed[id] {
			extra = append(extra, fmt.Sprintf("%s: %d+%d tokens, %s USD (%s)", id, b.prompt, b.completion, money.Nanos(b.cost), b.source))
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("BILLING LOST: %d of %d answers the clients received whole are not in usage_events FINAL, e.g. %v",
			len(missing), completed, missing[:min(len(missing), 10)])
	}
	if len(wrong) > 0 {
		t.Errorf("%d completed answers are billed with other usage than the upstream reported (%d+%d tokens, %s USD), e.g. %v",
			len(wrong), loadPromptTokens, loadCompletionTokens, perCall, wrong[:min(len(wrong), 10)])
	}
	if len(extra) > maxExtra {
		t.Errorf("%d events billed beyond the %d completed answers, at most %d allowed (%d requests failed at the client): %v",
			len(extra), completed, maxExtra, failed, extra[:min(len(extra), 10)])
	} else if len(extra) > 0 {
		t.Logf("%d events billed whose answer no client received whole (the kill cut them): %v", len(extra), extra)
	}
	n := int64(completed)
	if prompt != n*loadPromptTokens || completion != n*loadCompletionTokens || money.Nanos(cost) != money.Nanos(n)*perCall {
		t.Errorf("completed answers are billed %d prompt + %d completion tokens, %s USD; the clients got %d answers of %d+%d tokens at %s USD: %d+%d tokens, %s USD",
			prompt, completion, money.Nanos(cost), n, loadPromptTokens, loadCompletionTokens, perCall,
			n*loadPromptTokens, n*loadCompletionTokens, money.Nanos(n)*perCall)
	}

	var rowsCost money.Nanos
	for _, b := range rows {
		rowsCost += money.Nanos(b.cost)
	}
	total := l.sumCost(account)
	if total != rowsCost {
		t.Errorf("sum(cost_nanos) FINAL is %s USD, the rows add up to %s USD", total, rowsCost)
	}
	var acc struct {
		Balance  string `json:"balance_usd"`
		Credited string `json:"credited_usd"`
		Debited  string `json:"debited_usd"`
	}
	g.admin("GET", "/admin/v1/accounts/"+account, nil, 200, &acc)
	balance, debited, credited := parseUSD(t, acc.Balance), parseUSD(t, acc.Debited), parseUSD(t, acc.Credited)
	if credited != credit || debited != total || balance != credit-total {
		t.Errorf("account %s: balance %s, credited %s, debited %s USD; want credited %s, debited sum(cost_nanos) FINAL = %s, balance %s",
			account, balance, credited, debited, credit, total, credit-total)
	}
}

func parseUSD(t *testing.T, s string) money.Nanos {
	t.Helper()
	n, err := money.ParseUSD(s)
	if err != nil {
		t.Fatalf("parsing %q: %v", s, err)
	}
	return n
}

// newAccount creates an account with credit through g's admin API and a
// key for it, returning the key.
func newAccount(t *testing.T, g *gateway, id string, credit string) (keyID, key string) {
	t.Helper()
	g.admin("POST", "/admin/v1/accounts", map[string]string{"id": id, "credit_usd": credit}, 201, nil)
	var created struct {
		KeyID string `json:"key_id"`
		Key   string `json:"key"`
	}
	g.admin("POST", "/admin/v1/accounts/"+id+"/keys", map[string]string{"name": "e2e-" + id}, 201, &created)
	if created.KeyID == "" || created.Key == "" {
		t.Fatalf("key creation answered no key_id or key")
	}
	return created.KeyID, created.Key
}
