package meter

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/money"
)

// Debiter is a Recorder that charges each event's cost to its account in
// the background. Record only appends to a queue, so the request path never
// waits on the account store.
type Debiter struct {
	debit func(ctx context.Context, account string, amount money.Nanos) (accounts.Account, error)
	logf  func(string, ...any)

	mu      sync.Mutex
	pending map[string]money.Nanos
	wake    chan struct{}
	done    chan struct{}
}

// NewDebiter returns a Debiter; call Run to start charging.
func NewDebiter(debit func(context.Context, string, money.Nanos) (accounts.Account, error), logf func(string, ...any)) *Debiter {
	return &Debiter{debit: debit, logf: logf, pending: map[string]money.Nanos{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// Record queues ev's cost, summed per account until the next charge.
func (d *Debiter) Record(ev *Event) {
	if ev.CostNanos == 0 {
		return
	}
	d.mu.Lock()
	d.pending[ev.Account] += ev.CostNanos
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run charges queued costs until ctx ends, then charges what is left.
func (d *Debiter) Run(ctx context.Context) {
	defer close(d.done)
	for {
		select {
		case <-ctx.Done():
			d.flush(context.Background())
			return
		case <-d.wake:
			d.flush(ctx)
		}
	}
}

func (d *Debiter) flush(ctx context.Context) {
	d.mu.Lock()
	batch := d.pending
	d.pending = map[string]money.Nanos{}
	d.mu.Unlock()
	for account, amount := range batch {
		for attempt := 0; ; attempt++ {
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := d.debit(c, account, amount)
			cancel()
			if err == nil || attempt >= 5 || ctx.Err() != nil {
				if err != nil {
					d.logf("meter: debiting %s USD from %s failed: %v", amount, account, err)
				}
				break
			}
			time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
		}
	}
}

// Close waits for Run to finish its last charge.
func (d *Debiter) Close() { <-d.done }
