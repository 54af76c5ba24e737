package batch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Finished jobs are kept batch.job_retention after their record was last
// written, then deleted with their files by the reaper of any process.
// The job records' stream holds one message per record, its last write,
// in the order written, so the records not written since the cutoff are
// its first messages: a sweep reads on from where the one before stopped
// to the first record written after the cutoff, never the whole bucket.
// A finished job's last write is its end, or a results link asked for
// near the end of its time (keepForLink). What a sweep passes over and
// leaves, pending and processing jobs, is not read again by this
// process: starting, running, ending or deleting a job writes its record
// anew, or its tombstone, at the stream's end.

// sweep is the retention reaper's state in one process.
type sweep struct {
	mu sync.Mutex
	// next is the sequence of the job records' stream the next sweep
	// reads from.
	next uint64
	// retry holds the jobs whose deletion failed after they were marked
	// deleting (the object store was down): the mark is a write, which
	// took them out of the sweep's way for another retention.
	retry []jobRef
}

type jobRef struct{ account, id string }

// maxSweepDeletes bounds the jobs one sweep deletes, so that the first
// sweep after an upgrade (every job ever finished, maybe) does not hold
// the reaper's other work back for long: the next sweep goes on.
const maxSweepDeletes = 1000

// jobRetention is batch.job_retention, or the tests' shorter one.
func (s *Service) jobRetention() time.Duration {
	if s.t.jobRetention > 0 {
		return s.t.jobRetention
	}
	return s.runtime.Config().Batch.JobRetention
}

// keepForLink writes the job's record again, as it is, when a results
// link expiring at expires would outlive the job's retention: the job is
// then kept a retention from now. Its revision must still be the
// entry's (jetstream.ErrKeyRevisionMismatch otherwise). Links asked for
// earlier in the job's time write nothing.
func (s *Service) keepForLink(ctx context.Context, entry jetstream.KeyValueEntry, expires time.Time) error {
	if !entry.Created().Add(s.jobRetention()).Before(expires) {
		return nil
	}
	_, err := s.jobs.Update(ctx, entry.Key(), entry.Value(), entry.Revision())
	return err
}

// reapFinished deletes the jobs that ended, or whose DELETE failed, more
// than the retention ago, with their files, and the tombstones of jobs
// deleted as long ago (dropTombstone says why a delete leaves one).
func (s *Service) reapFinished(ctx context.Context) {
	s.swept.mu.Lock()
	defer s.swept.mu.Unlock()
	var left []jobRef
	for _, ref := range s.swept.retry {
		// Only a job still marked deleting: nothing can start it, nor
		// ask its results, so its end is still its last use.
		j, _, err := s.load(ctx, ref.account, ref.id)
		if err == nil && j.Deleting && s.Delete(ctx, ref.account, ref.id) != nil {
			left = append(left, ref)
		}
	}
	if s.swept.retry = left; len(left) > 0 {
		return // the store still fails: mark no more jobs deleting
	}
	retention := s.jobRetention()
	cutoff := time.Now().Add(-retention)
	deleted := 0
	for ctx.Err() == nil && deleted < maxSweepDeletes {
		msg, err := s.jobsLog.GetMsg(ctx, max(s.swept.next, 1), jetstream.WithGetMsgSubject(jobSubjectPrefix+">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			s.logf("batch: looking for jobs ended over %s ago: %v", retention, err)
			break
		}
		if !msg.Time.Before(cutoff) {
			break
		}
		key := strings.TrimPrefix(msg.Subject, jobSubjectPrefix)
		if msg.Header.Get("KV-Operation") != "" { // a deleted job's tombstone
			s.dropTombstone(ctx, key)
			s.swept.next = msg.Sequence + 1
			continue
		}
		j, err := decodeJob(msg.Data)
		if err != nil || j.Status == StatusProcessing || j.Status == StatusPending && !j.Deleting {
			s.swept.next = msg.Sequence + 1
			continue
		}
		err = s.deleteJob(ctx, j.Account, j.ID, msg.Sequence)
		if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, errChangedSince) && !errors.Is(err, ErrConflict) {
			// The object store is down, most likely: the sweep stops at
			// the first job it could not delete, to go on from it next
			// time, rather than mark every job due.
			s.logf("batch: deleting job %s of %s, ended over %s ago: %v (tried again at the next sweep)", j.ID, j.Account, retention, err)
			if now, _, err := s.load(ctx, j.Account, j.ID); err == nil && now.Deleting {
				s.swept.retry = append(s.swept.retry, jobRef{j.Account, j.ID})
			}
			break
		}
		if err == nil {
			deleted++
		}
		s.swept.next = msg.Sequence + 1
	}
	if deleted > 0 {
		s.logf("batch: deleted %d jobs that ended over %s ago (batch.job_retention), with their files", deleted, retention)
	}
}
