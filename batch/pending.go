package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/storage"
)

// Pending jobs are counted, per account, by markers in a stream of their
// own: one message per pending job, on subject batch.pending.<key>, where
// <key> is the job's key in JobsBucket. The stream keeps per-subject
// counts, so counting an account's pending jobs is one stream info
// request over its markers, never a read of its job records (up to 256KiB
// each) nor of the jobs it keeps; and a marker removed with a subject
// purge leaves nothing behind, where a KV delete leaves a tombstone that
// every later count would walk over.
const (
	// PendingStream holds the markers of pending jobs.
	PendingStream = "BATCH_PENDING"
	// pendingSubjectPrefix + a job's key is its marker's subject.
	pendingSubjectPrefix = "batch.pending."
	// AbandonedAfter is how long after its upload form expired a pending
	// job with no input is deleted: nothing can start it any more (the
	// form cannot be renewed). The hour covers an upload begun just
	// before the form expired.
	AbandonedAfter = time.Hour
	// pendingRecheck is how often the reaper looks again at a pending job
	// that has its input, for one started or deleted without its marker
	// going (a process that died between the two).
	pendingRecheck = 24 * time.Hour
)

// ErrTooManyPending: the account holds batch.max_pending_jobs jobs
// created and not started; start or delete one first, or raise the
// setting.
var ErrTooManyPending = errors.New("too many pending batch jobs")

// pendingMarker is a marker's body.
type pendingMarker struct {
	// CheckAt is when the reaper next looks at the job: once its upload
	// form has been expired for AbandonedAfter, then every pendingRecheck.
	CheckAt time.Time `json:"check_at"`
}

func pendingSubject(account, id string) string { return pendingSubjectPrefix + jobKey(account, id) }

// pendingCount is how many jobs of account are pending, as their markers
// count them.
func (s *Service) pendingCount(ctx context.Context, account string) (int, error) {
	info, err := s.pending.Info(ctx, jetstream.WithSubjectFilter(pendingSubjectPrefix+accountToken(account)+".*"))
	if err != nil {
		return 0, fmt.Errorf("counting the pending jobs of %s: %w", account, err)
	}
	return len(info.State.Subjects), nil
}

// checkPendingCap refuses a new job of account when it holds limit
// pending jobs already (limit <= 0: no cap). Creates racing one another
// all pass the count before any is marked: the cap can be passed by the
// number of creates of the account in flight at that moment.
func (s *Service) checkPendingCap(ctx context.Context, account string, limit int) error {
	if limit <= 0 {
		return nil
	}
	n, err := s.pendingCount(ctx, account)
	if err != nil {
		return err
	}
	if n >= limit {
		return apiError(ErrTooManyPending, "this account has %d batch jobs pending (created and not started), and batch.max_pending_jobs is %d: start or delete one (DELETE /v1/batch/{job_id}) before creating another; a pending job whose input was never uploaded is deleted %s after its upload form expires", n, limit, AbandonedAfter)
	}
	return nil
}

// markPending counts j, a job being created, as pending.
func (s *Service) markPending(ctx context.Context, j *Job) error {
	data, err := json.Marshal(pendingMarker{CheckAt: j.UploadExpiresAt.Add(s.t.abandonedAfter)})
	if err != nil {
		return err
	}
	if _, err := s.js.Publish(ctx, pendingSubject(j.Account, j.ID), data); err != nil {
		return fmt.Errorf("counting job %s as pending: %w", j.ID, err)
	}
	return nil
}

// unmarkPending stops counting job id as pending. A marker left behind by
// a failure here is removed by the reaper, within a day.
func (s *Service) unmarkPending(ctx context.Context, account, id string) {
	if err := s.pending.Purge(ctx, jetstream.WithPurgeSubject(pendingSubject(account, id))); err != nil {
		s.logf("batch: job %s is no longer pending but still counted so: %v (the reaper clears it)", id, err)
	}
}

// reapPending looks at the pending jobs whose marker is due: it deletes
// those that can never start (no input, the upload form expired
// AbandonedAfter ago), drops the markers of jobs no longer pending, and
// sets the next look at the others.
func (s *Service) reapPending(ctx context.Context) {
	info, err := s.pending.Info(ctx, jetstream.WithSubjectFilter(pendingSubjectPrefix+">"))
	if err != nil {
		s.logf("batch: listing pending jobs: %v", err)
		return
	}
	now := time.Now()
	for subject := range info.State.Subjects {
		if ctx.Err() != nil {
			return
		}
		msg, err := s.pending.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			continue
		}
		var m pendingMarker
		if json.Unmarshal(msg.Data, &m) == nil && now.Before(m.CheckAt) {
			continue
		}
		token, id, _ := strings.Cut(strings.TrimPrefix(subject, pendingSubjectPrefix), ".")
		account := accountOfToken(token)
		j, _, err := s.load(ctx, account, id)
		if errors.Is(err, ErrNotFound) || err == nil && j.Status != StatusPending {
			s.unmarkPending(ctx, account, id)
			continue
		}
		if err != nil {
			continue
		}
		formExpired := s.uploadFormExpiry(j)
		next := now.Add(pendingRecheck)
		if _, err := s.store.Stat(ctx, j.InputKey); errors.Is(err, storage.ErrNotExist) {
			if abandoned := formExpired.Add(s.t.abandonedAfter); now.Before(abandoned) {
				next = abandoned
			} else {
				s.logf("batch: deleting job %s of %s: pending without input %s after its upload form expired", id, account, now.Sub(formExpired).Round(time.Second))
				if err := s.Delete(ctx, account, id); err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConflict) {
					s.logf("batch: deleting abandoned job %s: %v", id, err)
				}
				continue
			}
		} else if err != nil {
			continue
		}
		data, err := json.Marshal(pendingMarker{CheckAt: next})
		if err != nil {
			continue
		}
		// Only over the marker read: one purged meanwhile (the job
		// started) stays purged.
		_, _ = s.js.Publish(ctx, subject, data, jetstream.WithExpectLastSequencePerSubject(msg.Sequence))
	}
}
