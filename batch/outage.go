package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// outage is a job's engine answering unavailable, shared by the job's
// lines: the job pauses, and when the pause is over one line tries the
// engine for all of them until it answers. The pause is the retry's
// backoff (tuning.retryBackoff, doubling), or the engine's Retry-After
// when longer. Each line retrying on its own schedule multiplied the
// load on a refusing upstream: 128 lines sent ~790 calls in 31 s to one
// that answered every call 429 with Retry-After 60.
type outage struct {
	first   time.Duration // the first backoff; each retry's doubles
	retries int           // the retries after which the job stops

	mu       sync.Mutex
	on       bool          // the engine failed a call, and has answered none since
	tried    int           // the retries of this outage so far
	waited   time.Duration // what its pauses added up to
	resumeAt time.Time     // no line asks the engine before
	trying   bool          // a line is trying the engine for the others
	changed  chan struct{} // closed, and replaced, when any of the above changes
	// err: the outage outlasted the retries, or asked for longer than
	// they wait; every line ends with it.
	err error
}

// retryLater is an engine that asked, by its Retry-After, to be left
// alone for longer than the job's retries wait.
type retryLater struct {
	err   error
	after time.Duration
	at    time.Time // when to start the job again
}

func (e *retryLater) Error() string {
	return fmt.Sprintf("%v, asking to be called again in %ds (Retry-After), more than the job waits", e.err, int((e.after+time.Second-1)/time.Second))
}

func (e *retryLater) Unwrap() error { return e.err }

func newOutage(first time.Duration, retries int) *outage {
	return &outage{first: first, retries: retries, changed: make(chan struct{})}
}

// budget is what the retries' backoffs add up to: first, 2 first, …
func (o *outage) budget() time.Duration { return o.first * (1<<o.retries - 1) }

// broadcast wakes the lines waiting for a change.
//
// o.mu must be held.
func (o *outage) broadcast() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// admit waits until a line may ask the engine: at once without an
// outage; during one, once its pause is over and no other line is
// trying. trial says the line tries for the others: it must tell o how
// it went (answered, failed or release).
func (o *outage) admit(ctx context.Context) (trial bool, err error) {
	for {
		o.mu.Lock()
		if o.err != nil {
			o.mu.Unlock()
			return false, o.err
		}
		if !o.on {
			o.mu.Unlock()
			return false, nil
		}
		wait := time.Until(o.resumeAt)
		if wait <= 0 && !o.trying {
			o.trying = true
			o.mu.Unlock()
			return true, nil
		}
		changed := o.changed
		o.mu.Unlock()
		var pause <-chan time.Time
		if wait > 0 {
			pause = time.After(wait) // collected once it fires or is dropped (Go 1.23)
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-changed:
		case <-pause:
		}
	}
}

// answered records a call the engine answered: the outage, if any, is
// over.
func (o *outage) answered(trial bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !trial && !o.on {
		return
	}
	o.trying = o.trying && !trial
	o.on, o.tried, o.waited = false, 0, 0
	o.broadcast()
}

// release records a trial that ended without a word on the engine (the
// run stopped).
func (o *outage) release(trial bool) {
	if !trial {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.trying = false
	o.broadcast()
}

// failed records a call the engine failed with err, unavailable: the
// outage's next retry, unless the call was sent before the outage began
// (it counts with the call that began it). It returns the error that
// ends the line, and the job, when the outage has outlasted the retries
// or the engine asked for longer than they have left to wait.
func (o *outage) failed(trial bool, err error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	defer o.broadcast()
	if trial {
		o.trying = false
	}
	if o.err != nil || o.on && !trial {
		return o.err
	}
	if o.tried == o.retries {
		o.err = err
		return o.err
	}
	pause := o.first << o.tried
	var ue *UnavailableError
	if errors.As(err, &ue) && ue.RetryAfter > pause {
		if ue.RetryAfter > o.budget()-o.waited {
			o.err = &retryLater{err: err, after: ue.RetryAfter, at: time.Now().Add(ue.RetryAfter)}
			return o.err
		}
		pause = ue.RetryAfter
	}
	o.on, o.tried, o.waited, o.resumeAt = true, o.tried+1, o.waited+pause, time.Now().Add(pause)
	return nil
}
