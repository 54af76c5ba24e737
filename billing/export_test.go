package billing

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// SetHooks sets the test hooks of o: run after the INSERT and after
// the debits of each batch; an error ends Run without acking.
func SetHooks(o *Options, afterInsert, afterDebit func() error) {
	o.afterInsert, o.afterDebit = afterInsert, afterDebit
}

// FetchOnce makes the consumer and fetches once, as Run does in its loop.
func FetchOnce(ctx context.Context, js jetstream.JetStream, opts Options) (int, error) {
	b := &biller{js: js, opts: opts.withDefaults()}
	if err := b.ensureConsumer(ctx); err != nil {
		return 0, err
	}
	msgs, err := b.fetch()
	return len(msgs), err
}
