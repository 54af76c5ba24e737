package batch

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Tuning shortens the service's timings for tests, and Hook lets a test
// kill a worker at a named point (see Service.at).
type Tuning struct {
	StartGrace, Heartbeat, CheckpointAge, StaleAfter, ReapEvery, RetryBackoff time.Duration
	AbandonedAfter, JobRetention, UnwrittenFor                                time.Duration
	Retries, MaxAttempts                                                      int
	Hook                                                                      func(point string) bool
}

// WithTuning returns o with t applied.
func WithTuning(o Options, t Tuning) Options {
	o.tuning = tuning{startGrace: t.StartGrace, heartbeat: t.Heartbeat, checkpointAge: t.CheckpointAge,
		staleAfter: t.StaleAfter, reapEvery: t.ReapEvery, retryBackoff: t.RetryBackoff, abandonedAfter: t.AbandonedAfter, jobRetention: t.JobRetention,
		unwrittenFor: t.UnwrittenFor,
		retries:      t.Retries, maxAttempts: t.MaxAttempts, hook: t.Hook}
	return o
}

// ReapOnce runs one pass of the reaper.
func (s *Service) ReapOnce(ctx context.Context) { s.reapOnce(ctx) }

// Exported for tests: key names.
var (
	JobKey      = jobKey
	InputObject = inputObject
)

// ReadJobsThrough has the service read job records through what wrap
// makes of its bucket (a replica behind the leader, say), and confirm
// their misses through js, as with replicated buckets.
func (s *Service) ReadJobsThrough(wrap func(jetstream.KeyValue) jetstream.KeyValue, js jetstream.JetStream) {
	s.jobs = wrap(s.jobs)
	s.js = js
	s.replicated = true
}

// ReadNewestThrough has the service read the index of the newest jobs
// through what wrap makes of its bucket (a replica behind the leader),
// its buckets replicated as replicated says.
func (s *Service) ReadNewestThrough(wrap func(jetstream.KeyValue) jetstream.KeyValue, replicated bool) {
	s.newest = wrap(s.newest)
	s.replicated = replicated
}
