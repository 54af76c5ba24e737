package batch

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Retry-After the retries have time for is waited instead of a
// shorter backoff; a line failing while another is trying for the job
// does not count as a retry.
func TestOutagePausesForTheLongerOfBackoffAndRetryAfter(t *testing.T) {
	o := newOutage(10*time.Millisecond, 5) // the retries wait 310 ms in all
	if trial, err := o.admit(t.Context()); trial || err != nil {
		t.Fatalf("admit without an outage: trial %v, %v", trial, err)
	}
	before := time.Now()
	if err := o.failed(false, &UnavailableError{Msg: "answered 429", RetryAfter: 200 * time.Millisecond}); err != nil {
		t.Fatalf("the first failure ended the job: %v", err)
	}
	if pause := o.resumeAt.Sub(before); pause < 200*time.Millisecond {
		t.Errorf("paused %s, want the Retry-After's 200ms", pause)
	}
	// Sent before the pause began: no retry of its own.
	if err := o.failed(false, &UnavailableError{Msg: "answered 429"}); err != nil || o.tried != 1 {
		t.Fatalf("a call in flight when the outage began counted: tried %d, %v", o.tried, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := o.admit(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admitted during the pause: %v", err)
	}
	// 200 ms waited, 110 ms left: a Retry-After of 150 ms stops the job.
	o.resumeAt = time.Now()
	trial, err := o.admit(t.Context())
	if !trial || err != nil {
		t.Fatalf("after the pause: trial %v, %v; want this line to try for the job", trial, err)
	}
	err = o.failed(true, &UnavailableError{Msg: "answered 429", RetryAfter: 150 * time.Millisecond})
	var later *retryLater
	if !errors.As(err, &later) || !errors.Is(err, ErrEngineUnavailable) {
		t.Fatalf("a Retry-After past the retries: %v", err)
	}
	if _, err := o.admit(t.Context()); err != later {
		t.Errorf("the next line was admitted with %v, want the job's end", err)
	}
}
