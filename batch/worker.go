package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

var (
	// errLost: another worker took the run over (this one stalled past
	// AckWait); the run stops without another write.
	errLost = errors.New("another worker took the job over")
	// errDied is a test hook's simulated kill.
	errDied = errors.New("worker killed (test hook)")
)

// RunWorker processes jobs from the work queue, batch.max_jobs at a time,
// until ctx ends, then returns once its jobs have stopped. A job stopped by
// ctx goes back to the queue and resumes, on any worker, from its last
// checkpoint. `tollgate serve` runs it beside the API; `tollgate worker`
// runs only it.
func (s *Service) RunWorker(ctx context.Context) error {
	cons, err := s.work.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       workerConsumer,
		Description:   "tollgate batch workers",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.ackWait,
		MaxDeliver:    -1, // a job that keeps failing is failed by its attempt count
		FilterSubject: workSubjectPrefix + "*",
	})
	if err != nil {
		return fmt.Errorf("batch: creating the worker consumer: %w", err)
	}
	slots := max(s.runtime.Config().Batch.MaxJobs, 1)
	var wg sync.WaitGroup
	for range slots {
		wg.Go(func() { s.pull(ctx, cons) })
	}
	wg.Go(func() { s.reap(ctx) })
	wg.Wait()
	return nil
}

// pullWait is how long one pull request waits for work. Short, because a
// stopping worker cannot withdraw its pull requests: a job it gives back
// (see process) must not land in one, so it is given back after pullWait.
const pullWait = time.Second

// pull takes one job at a time: a worker busy with a job holds no other
// message, so a queued job waits for a free worker, never for a busy one.
func (s *Service) pull(ctx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, pullWait)
		msgs, err := cons.Fetch(1, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			if ctx.Err() == nil {
				s.logf("batch: fetching work: %v", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		for msg := range msgs.Messages() {
			s.handle(ctx, msg)
		}
		cancel()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// handle takes up the run a work message names, unless the message is
// stale (the job was deleted, ended or restarted since) or another worker
// is alive on it.
func (s *Service) handle(ctx context.Context, msg jetstream.Msg) {
	var wm workMessage
	if err := json.Unmarshal(msg.Data(), &wm); err != nil || wm.Key == "" {
		s.logf("batch: dropping a malformed work message %q", msg.Data())
		_ = msg.Term()
		return
	}
	for try := 0; ; try++ {
		entry, err := s.jobs.Get(ctx, wm.Key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			_ = msg.Ack()
			return
		}
		if err != nil {
			s.logf("batch: reading job %s: %v", wm.Key, err)
			_ = msg.NakWithDelay(5 * time.Second)
			return
		}
		j, err := decodeJob(entry.Value())
		if err != nil || j.Status != StatusProcessing || j.Run != wm.Run {
			_ = msg.Ack()
			return
		}
		// A live worker renews the heartbeat every ackWait/3; a dead one's
		// message comes back only after ackWait. A young heartbeat means a
		// worker is alive on the job (its renewals of the message were
		// late): look again later, and take over only if it goes silent.
		if j.HeartbeatAt != nil && time.Since(*j.HeartbeatAt) < s.ackWait/2 {
			_ = msg.NakWithDelay(s.ackWait)
			return
		}
		if j.Attempt >= s.t.maxAttempts {
			o := s.newOwner(j, entry.Revision(), func() {})
			msgText := fmt.Sprintf("gave up after %d tries, each stopped before the end (a worker died, or the object store, NATS or the model failed)", j.Attempt)
			if j.Error != "" {
				msgText += " (last: " + j.Error + ")"
			}
			if err := o.fail(ctx, msgText+"; start it again"); err == nil {
				_ = msg.Ack()
			}
			return
		}
		if s.cleanUp(ctx, j) {
			j.Leftovers = nil
		}
		now := time.Now().UTC()
		j.Attempt++
		j.Worker, j.HeartbeatAt = s.name, &now
		data, err := json.Marshal(j)
		if err != nil {
			_ = msg.Term()
			return
		}
		rev, err := s.jobs.Update(ctx, wm.Key, data, entry.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && try < 3 {
			continue
		}
		if err != nil {
			s.logf("batch: taking up job %s: %v", j.ID, err)
			_ = msg.NakWithDelay(5 * time.Second)
			return
		}
		s.process(ctx, msg, j, rev)
		return
	}
}

// cleanUp deletes, before a worker takes up j, what earlier attempts
// left: the part the previous attempt may have written after its last
// checkpoint, its results file if it died while joining them (neither is
// named by the record), and the parts of earlier runs. It reports whether
// the latter are all gone, so the record can stop listing them.
func (s *Service) cleanUp(ctx context.Context, j *Job) (leftoversGone bool) {
	var keys []string
	if j.Attempt > 0 {
		keys = append(keys, partObject(j.Account, j.ID, j.Run, j.Attempt, j.Progress.nextSeq()),
			resultObject(j.Account, j.ID, j.Run, j.Attempt))
	}
	keys = append(keys, j.partKeys(j.Leftovers)...)
	leftoversGone = true
	for _, key := range keys {
		if err := s.store.Delete(ctx, key); err != nil {
			s.logf("batch: job %s: deleting %s: %v", j.ID, key, err)
			leftoversGone = false
		}
	}
	return leftoversGone
}

// process runs a run this worker took up, renewing its claim on the
// message and the job until the run ends.
func (s *Service) process(ctx context.Context, msg jetstream.Msg, j *Job, rev uint64) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	o := s.newOwner(j, rev, cancel)
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		tick := time.NewTicker(s.t.heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
				if s.at("heartbeat") {
					continue
				}
				_ = msg.InProgress()
				_ = o.update(runCtx, func(j *Job) { now := time.Now().UTC(); j.HeartbeatAt = &now })
			}
		}
	}()
	err := s.run(runCtx, o)
	cancel()
	<-beats
	switch {
	case errors.Is(err, errLost):
		s.logf("batch: job %s was taken over by another worker while this one stalled; stopping", o.id)
	case errors.Is(err, errDied):
		// Leave the message alone: it belongs to whoever holds the job.
	case err == nil:
		// The job ended, completed or failed, in its record.
		_ = msg.Ack()
	default:
		// Stopped (shutdown) or a passing fault of NATS or the store:
		// give the run back so a worker resumes it from the checkpoint.
		// Clearing the heartbeat first lets that worker take it at once.
		bg, stop := context.WithTimeout(context.Background(), 5*time.Second)
		defer stop()
		note := ""
		if ctx.Err() == nil {
			note = withoutAddresses(err.Error())
			s.logf("batch: job %s stopped at line %d: %v; it resumes from there", o.id, o.snapshot().Progress.Lines, err)
		}
		if o.update(bg, func(j *Job) { j.HeartbeatAt, j.Worker = nil, ""; j.Error = note }) == nil {
			if ctx.Err() != nil {
				_ = msg.NakWithDelay(2 * pullWait)
			} else {
				_ = msg.NakWithDelay(faultBackoff(o.snapshot().Attempt))
			}
		}
	}
}

// faultBackoff is how long a run stopped by a passing fault waits before
// the attempt after attempt: 5 s, doubling, at most 5 minutes. At a fixed
// 5 s the attempts ran out in under 3 minutes, and an object store down
// that long failed the job.
func faultBackoff(attempt int) time.Duration {
	return min(5*time.Second<<min(max(attempt-1, 0), 6), 5*time.Minute)
}

// owner is a worker's hold on one run: every write to the job record is a
// compare-and-set on the revision it last wrote, so a write after another
// worker took over fails, and the run stops.
type owner struct {
	s      *Service
	id     string
	key    string
	cancel context.CancelFunc

	mu   sync.Mutex
	job  *Job
	rev  uint64
	lost bool
}

func (s *Service) newOwner(j *Job, rev uint64, cancel context.CancelFunc) *owner {
	return &owner{s: s, id: j.ID, key: jobKey(j.Account, j.ID), cancel: cancel, job: j, rev: rev}
}

// snapshot returns a copy of the record as last written.
func (o *owner) snapshot() *Job {
	o.mu.Lock()
	defer o.mu.Unlock()
	return cloneJob(o.job)
}

// update applies change to a copy of the record and writes it.
func (o *owner) update(ctx context.Context, change func(*Job)) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lost {
		return errLost
	}
	for try := 0; ; try++ {
		next := cloneJob(o.job)
		change(next)
		data, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("encoding job %s: %w", o.id, err)
		}
		rev, err := o.s.jobs.Update(ctx, o.key, data, o.rev)
		if err == nil {
			o.job, o.rev = next, rev
			return nil
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			o.lost = true
			o.cancel()
			return errLost
		}
		if try == 2 || ctx.Err() != nil {
			return fmt.Errorf("saving job %s: %w", o.id, err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// fail ends the run as failed with msg, for the client; starting the job
// again runs it from its first line.
func (o *owner) fail(ctx context.Context, msg string) error {
	return o.end(ctx, msg, false)
}

// stop ends the run as failed with msg, keeping its checkpoint: starting
// the job again resumes there.
func (o *owner) stop(ctx context.Context, msg string) error {
	return o.end(ctx, msg, true)
}

func (o *owner) end(ctx context.Context, msg string, resumable bool) error {
	err := o.update(ctx, func(j *Job) {
		now := time.Now().UTC()
		j.Status, j.Error, j.CompletedAt, j.HeartbeatAt = StatusFailed, msg, &now, nil
		j.Resumable = resumable
	})
	if err != nil {
		return err
	}
	j := o.snapshot()
	o.s.release(ctx, j.Account, j.ID)
	return nil
}

// reap repairs what a process that died mid-operation can leave: an
// active marker whose job no longer processes (cleared), and a processing
// job with no work message, which no worker would ever take (queued
// again). Worker deaths themselves need no repair: JetStream redelivers
// their messages. It also deletes the pending jobs that can never start
// (see reapPending), and the finished jobs past batch.job_retention (see
// reapFinished).
func (s *Service) reap(ctx context.Context) {
	tick := time.NewTicker(s.t.reapEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.reapOnce(ctx)
		}
	}
}

func (s *Service) reapOnce(ctx context.Context) {
	s.reapPending(ctx)
	s.reapFinished(ctx)
	lister, err := s.active.ListKeys(ctx)
	if err != nil {
		if !errors.Is(err, jetstream.ErrNoKeysFound) {
			s.logf("batch: listing active jobs: %v", err)
		}
		return
	}
	var keys []string
	for key := range lister.Keys() {
		keys = append(keys, key)
	}
	for _, key := range keys {
		entry, err := s.active.Get(ctx, key)
		if err != nil {
			continue
		}
		account := accountOfToken(key)
		stale, holder, err := s.markerStale(ctx, account, entry.Value())
		if err != nil {
			continue
		}
		if stale {
			_ = s.active.Delete(ctx, key, jetstream.LastRevision(entry.Revision()))
			continue
		}
		j, _, err := s.load(ctx, account, holder)
		if err != nil || j.Status != StatusProcessing {
			continue
		}
		last := j.StartedAt
		if j.HeartbeatAt != nil {
			last = j.HeartbeatAt
		}
		if last == nil || time.Since(*last) < s.t.staleAfter {
			continue
		}
		_, err = s.work.GetLastMsgForSubject(ctx, workSubjectPrefix+j.ID)
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // queued or held: a worker has it or will
		}
		s.logf("batch: job %s is processing but not queued (a start died half way?); queueing it again", j.ID)
		if err := s.enqueue(ctx, j, fmt.Sprintf("%s.%d.r%d", j.ID, j.Run, j.Attempt)); err != nil {
			s.logf("batch: queueing job %s again: %v", j.ID, err)
		}
	}
}

// withoutAddresses is a fault's text for the job's error, which its
// client reads: URLs and host:port addresses (the object store's private
// endpoint, NATS) are the operator's, in the log.
func withoutAddresses(text string) string {
	text = urlPattern.ReplaceAllString(text, "<address>")
	return hostPortPattern.ReplaceAllString(text, "<address>")
}

var (
	urlPattern      = regexp.MustCompile(`"?[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"]+"?`)
	hostPortPattern = regexp.MustCompile(`(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*\.[A-Za-z0-9-]+|localhost):[0-9]{1,5}\b`)
)
