package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/storage"
)

// ErrInvalid: the request cannot make a job; the message says why.
var ErrInvalid = errors.New("invalid batch request")

// CreateParams is a validated POST /v1/batch.
type CreateParams struct {
	Account, KeyID string
	KeyModels      []string
	Classifier     string
	Request        Request
	Model          string
}

// Created is the 201 answer of POST /v1/batch (spec 4.3).
type Created struct {
	JobID        string            `json:"job_id"`
	UploadURL    string            `json:"upload_url"`
	UploadFields map[string]string `json:"upload_fields"`
	InputKey     string            `json:"input_key"`
	// UploadExpiresAt is when upload_url stops accepting the file.
	UploadExpiresAt string `json:"upload_expires_at"`
}

// createBound bounds the NATS work of a job's creation, as the account
// store's calls are bound: a stream leader elected within it (4 to 8 s
// after one is lost) makes the job, and with none the call fails then,
// not after the plugin's 30 s.
const createBound = 10 * time.Second

// natsAttempt bounds one NATS request of a job's creation. A request sent
// to a stream leader that died is never answered, and its replacement
// answers only requests sent again.
const natsAttempt = 2 * time.Second

// unansweredPause is the wait before asking again a stream that had no
// leader to answer at once (no responders).
const unansweredPause = 250 * time.Millisecond

// askAgain runs ask with natsAttempt to answer, and again while no stream
// leader answers it, until ctx ends. ask must be safe to repeat: a
// write that was not answered may have landed.
func askAgain(ctx context.Context, ask func(context.Context) error) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, natsAttempt)
		err := ask(attempt)
		cancel()
		if err == nil || ctx.Err() != nil || !noLeaderAnswered(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(unansweredPause):
		}
	}
}

// noLeaderAnswered: err is what a request gets while its stream elects a
// leader (or has lost its quorum).
func noLeaderAnswered(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, broker.ErrLeaderUnavailable) ||
		(errors.As(err, &apiErr) && apiErr.Code == 503)
}

// Create records a pending job and presigns the upload of its input.
func (s *Service) Create(ctx context.Context, p CreateParams) (Created, error) {
	ctx, cancel := context.WithTimeout(ctx, createBound)
	defer cancel()
	cfg := s.runtime.Config()
	id, err := uuid.NewV7()
	if err != nil {
		return Created{}, fmt.Errorf("making a job id: %w", err)
	}
	now := time.Now().UTC()
	ttl := cfg.Storage.UploadTTL
	j := &Job{
		ID: id.String(), Account: p.Account, KeyID: p.KeyID, KeyModels: p.KeyModels, Status: StatusPending,
		Classifier: p.Classifier, Request: p.Request, Model: p.Model, Price: cfg.Batch.PricePerToken,
		InputKey: inputObject(p.Account, id.String()), CreatedAt: now, UploadExpiresAt: new(now.Add(ttl)),
	}
	data, err := json.Marshal(j)
	if err != nil {
		return Created{}, fmt.Errorf("encoding job %s: %w", j.ID, err)
	}
	if len(data) > maxRequestBytes {
		return Created{}, apiError(ErrInvalid, "labels, descriptions and examples of a batch job take %d bytes; at most %d are kept with a job", len(data), maxRequestBytes)
	}
	// Presigned before the creation is counted: an s3 store that has not
	// answered since the start refuses it, and a client retrying that 503
	// must not use up its max_jobs_created_per_hour.
	url, fields, err := s.store.PresignPost(ctx, j.InputKey, int64(cfg.Storage.MaxUploadBytes), ttl)
	if err != nil {
		return Created{}, fmt.Errorf("presigning the upload of job %s: %w", j.ID, err)
	}
	if err := askAgain(ctx, func(ctx context.Context) error { return s.checkPendingCap(ctx, p.Account, cfg.Batch.MaxPendingJobs) }); err != nil {
		return Created{}, err
	}
	// A job deleted is gone from the pending count: the cap alone let a
	// loop of create and delete write job records without end. Asked
	// again after a count that landed unanswered, the creation counts
	// twice: the limit errs on the side of the deployment.
	var made int
	var wait time.Duration
	err = askAgain(ctx, func(ctx context.Context) (err error) {
		made, wait, err = s.created.Take(ctx, p.Account, cfg.Batch.MaxJobsCreatedPerHour)
		return err
	})
	if err != nil {
		return Created{}, err
	} else if wait > 0 {
		e := apiError(ErrCreatedTooFast, "this account created %d batch jobs in the last hour, and batch.max_jobs_created_per_hour is %d (deleted jobs count): create the next in %s",
			made, cfg.Batch.MaxJobsCreatedPerHour, wait.Round(time.Second))
		e.RetryAfter = wait
		return Created{}, e
	}
	// Counted before it is stored, so that no job is ever pending
	// uncounted; a marker whose job was not stored is the reaper's.
	// A marker written twice counts once, and the index adds an id once.
	if err := askAgain(ctx, func(ctx context.Context) error { return s.markPending(ctx, j) }); err != nil {
		return Created{}, err
	}
	// Indexed before it is stored, so that no job is ever stored and
	// missing from its account's listing; an id whose record was not
	// stored is skipped there.
	err = askAgain(ctx, func(ctx context.Context) error {
		return s.updateNewest(ctx, p.Account, func(x *newestIndex) bool { x.add(j.ID); return true })
	})
	if err != nil {
		s.unmarkPending(ctx, p.Account, j.ID)
		return Created{}, err
	}
	mayHaveLanded := false
	err = askAgain(ctx, func(ctx context.Context) error {
		_, err := s.jobs.Create(ctx, jobKey(p.Account, j.ID), data)
		if errors.Is(err, jetstream.ErrKeyExists) && mayHaveLanded {
			return nil // the record an unanswered write stored: the id is new
		}
		mayHaveLanded = mayHaveLanded || noLeaderAnswered(err)
		return err
	})
	if err != nil {
		s.unmarkPending(ctx, p.Account, j.ID)
		s.removeNewest(ctx, p.Account, j.ID)
		return Created{}, fmt.Errorf("saving job %s: %w", j.ID, err)
	}
	return Created{JobID: j.ID, UploadURL: url, UploadFields: fields, InputKey: j.InputKey,
		UploadExpiresAt: *formatTime(new(now.Add(ttl)))}, nil
}

// Get returns one of account's jobs.
func (s *Service) Get(ctx context.Context, account, id string) (*Job, error) {
	j, _, err := s.load(ctx, account, id)
	return j, err
}

// load returns the job and its revision; ErrNotFound for an id account
// has no job under.
func (s *Service) load(ctx context.Context, account, id string) (*Job, uint64, error) {
	j, entry, err := s.loadEntry(ctx, account, id)
	if err != nil {
		return nil, 0, err
	}
	return j, entry.Revision(), nil
}

// loadEntry is load with the record's entry, which says when it was
// written.
func (s *Service) loadEntry(ctx context.Context, account, id string) (*Job, jetstream.KeyValueEntry, error) {
	if !validJobID(id) {
		return nil, nil, apiError(ErrNotFound, "no batch job has the id %q: job ids are UUIDs as POST /v1/batch returns them", id)
	}
	// A job created through another gateway was "not found" when read at
	// once through this one, from a replica behind the leader.
	entry, err := broker.GetLatest(ctx, s.js, s.jobs, jobKey(account, id), s.replicated)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil, apiError(ErrNotFound, "batch job %s does not exist (or was deleted)", id)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading job %s: %w", id, err)
	}
	j, err := decodeJob(entry.Value())
	if err != nil {
		return nil, nil, err
	}
	if j.Account != account { // the key says otherwise; never show it
		return nil, nil, apiError(ErrNotFound, "batch job %s does not exist (or was deleted)", id)
	}
	return j, entry, nil
}

// List returns account's 20 newest jobs, newest first: from the index of
// its newest jobs (newest.go), rebuilt by walking all its jobs when it is
// missing or names too few.
func (s *Service) List(ctx context.Context, account string) ([]*Job, error) {
	x, rev, err := s.newestIDs(ctx, account)
	if err != nil {
		return nil, err
	}
	jobs, missing, err := s.loadJobs(ctx, account, x.IDs)
	if err != nil {
		return nil, err
	}
	if len(jobs) == listLength || (rev != 0 && !x.Older) {
		if len(missing) > 0 {
			s.dropMissing(ctx, account, missing)
		}
		return jobs, nil
	}
	// The walk leaves the missing ids out of the index it writes.
	ids, err := s.rebuildNewest(ctx, account, x, rev)
	if err != nil {
		return nil, err
	}
	jobs, _, err = s.loadJobs(ctx, account, ids)
	return jobs, err
}

// loadJobs loads up to listLength of account's jobs ids names, in their
// order, skipping those deleted; missing are the ids skipped that are
// too old to be jobs whose record is being written.
func (s *Service) loadJobs(ctx context.Context, account string, ids []string) (jobs []*Job, missing []string, err error) {
	jobs = make([]*Job, 0, listLength)
	for _, id := range ids {
		if len(jobs) == listLength {
			break
		}
		j, _, err := s.load(ctx, account, id)
		if errors.Is(err, ErrNotFound) {
			if !s.mayBeUnwritten(id) {
				missing = append(missing, id)
			}
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		jobs = append(jobs, j)
	}
	return jobs, missing, nil
}

// Results returns a download URL of a completed job's results and when it
// expires. A link that would outlive the job's retention keeps the job
// (keepForLink): the reaper never deletes files a link given out still
// names.
func (s *Service) Results(ctx context.Context, account, id string) (string, time.Time, error) {
	for try := 0; ; try++ {
		j, entry, err := s.loadEntry(ctx, account, id)
		if err != nil {
			return "", time.Time{}, err
		}
		if j.Deleting {
			return "", time.Time{}, errDeleting(id)
		}
		switch j.Status {
		case StatusCompleted:
		case StatusFailed:
			return "", time.Time{}, apiError(ErrConflict, "job %s failed (%s): it has no results; start it again", id, j.Error)
		default:
			return "", time.Time{}, apiError(ErrConflict, "job %s is %s: results can be downloaded once it is completed", id, j.Status)
		}
		// Signed before the job is kept for the link: the store tells
		// when the link really expires (SigV4 counts whole seconds),
		// and a link not given out, the job not kept, does no harm.
		url, expires, err := s.store.PresignGet(ctx, j.OutputKey, s.runtime.Config().Storage.DownloadTTL)
		if err != nil {
			return "", time.Time{}, fmt.Errorf("presigning the results of job %s: %w", id, err)
		}
		err = s.keepForLink(ctx, entry, expires)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && try < 3 {
			continue // changed meanwhile (being deleted?): look again
		}
		if err != nil {
			return "", time.Time{}, fmt.Errorf("keeping job %s for its results link: %w", id, err)
		}
		return url, expires, nil
	}
}

// Delete removes a job that is not processing, with its files. The
// files go first and the record last: the record is all that names them,
// so a file that cannot be deleted (the object store is down) fails the
// call, for the client to retry, and keeps the record, marked Deleting so
// the job cannot start meanwhile. Deleting the record first left files in
// the bucket that nothing would ever delete.
func (s *Service) Delete(ctx context.Context, account, id string) error {
	return s.deleteJob(ctx, account, id, 0)
}

// errChangedSince: the record was written after the revision a deletion
// was decided on (deleteJob's onlyRev).
var errChangedSince = errors.New("the job changed since")

// deleteJob is Delete; with onlyRev not 0, of the job as it was at that
// revision only: a record written since (a results link asked for, a
// start) is left as it is, with errChangedSince.
func (s *Service) deleteJob(ctx context.Context, account, id string, onlyRev uint64) error {
	for try := 0; ; try++ {
		j, rev, err := s.load(ctx, account, id)
		if err != nil {
			return err
		}
		if onlyRev != 0 && rev != onlyRev {
			return errChangedSince
		}
		if j.Status == StatusProcessing {
			return apiError(ErrConflict, "job %s is processing and cannot be deleted: wait until it is completed or failed", id)
		}
		if !j.Deleting {
			next := cloneJob(j)
			next.Deleting = true
			data, err := json.Marshal(next)
			if err != nil {
				return fmt.Errorf("encoding job %s: %w", id, err)
			}
			rev, err = s.jobs.Update(ctx, jobKey(account, id), data, rev)
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && try < 3 {
				continue // changed meanwhile (started?): look again
			}
			if err != nil {
				return fmt.Errorf("marking job %s deleted: %w", id, err)
			}
			if onlyRev != 0 {
				onlyRev = rev // this deletion's own write
			}
		}
		for _, key := range j.objects() {
			if err := s.store.Delete(ctx, key); err != nil {
				return fmt.Errorf("deleting file %s of job %s: %w", key, id, err)
			}
		}
		err = s.jobs.Delete(ctx, jobKey(account, id), jetstream.LastRevision(rev))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && try < 3 {
			continue
		}
		if err != nil {
			return fmt.Errorf("deleting job %s: %w", id, err)
		}
		s.removeNewest(ctx, account, id)
		s.unmarkPending(ctx, account, id)
		s.release(ctx, account, id)
		return nil
	}
}

// dropTombstone removes the delete marker a KV delete leaves of the job
// under key, once the job has been deleted a batch.job_retention
// (reapFinished). A delete keeps it until then: the marker is what says
// the job is gone. The record's earlier writes were removed by the
// bucket's history limit, which nats-server notes only in the stream
// state it writes every 2-2.5 minutes; purging the marker at once left
// nothing on disk newer than them, and a server killed before its next
// state rebuilt the stream from its files with the last record back,
// marked as being deleted. Listings read the index of the newest jobs,
// so the markers cost only the walk that builds it.
func (s *Service) dropTombstone(ctx context.Context, key string) {
	if err := s.jobsLog.Purge(ctx, jetstream.WithPurgeSubject(jobSubjectPrefix+key)); err != nil {
		s.logf("batch: job %s is deleted, but its tombstone stays until the reaper's: %v", key, err)
	}
}

// errDeleting refuses what a job whose deletion did not finish can no
// longer do.
func errDeleting(id string) error {
	return apiError(ErrConflict, "job %s is being deleted (its files could not all be deleted yet): DELETE /v1/batch/%s again to finish", id, id)
}

// objects lists every file the job has made: input, results, and the
// parts of every run.
func (j *Job) objects() []string {
	keys := []string{j.InputKey}
	if j.OutputKey != "" {
		keys = append(keys, j.OutputKey)
	}
	keys = append(keys, j.partKeys(j.Progress.Parts)...)
	return append(keys, j.partKeys(j.Leftovers)...)
}

// Start moves a pending or failed job to processing and queues it (spec
// section 3).
func (s *Service) Start(ctx context.Context, account, id string) (*Job, error) {
	for try := 0; ; try++ {
		j, rev, err := s.load(ctx, account, id)
		if err != nil {
			return nil, err
		}
		switch {
		case j.Deleting:
			return nil, errDeleting(id)
		case j.Status == StatusProcessing:
			return nil, apiError(ErrConflict, "job %s is already processing: poll GET /v1/batch/%s until it is completed or failed", id, id)
		case j.Status == StatusCompleted:
			return nil, apiError(ErrConflict, "job %s is completed and cannot run again: download its results, or create a new job", id)
		}
		if _, err := s.store.Stat(ctx, j.InputKey); errors.Is(err, storage.ErrNotExist) {
			// The form cannot be renewed: pointing at it once it expired
			// sent the client round in circles.
			expired := s.uploadFormExpiry(j)
			if time.Now().After(expired) {
				return nil, apiError(ErrNoInput, "job %s has no input file, and its upload form expired at %s (storage.upload_ttl after the job was created): create a new job and upload to its form", id, *formatTime(&expired))
			}
			// An empty file, or one over storage.max_upload_bytes, is
			// refused by the upload itself (its policy's
			// content-length-range): a client that uploaded one and was
			// told "upload it first" saw no reason why.
			return nil, apiError(ErrNoInput, "job %s has no input file yet: upload it first (POST the file to upload_url with every upload_fields entry as a form field, the file last as field \"file\"; an empty file is refused, EntityTooSmall: a job needs at least one line; so is a file over storage.max_upload_bytes, %d bytes here, EntityTooLarge: split it over several jobs), then start the job",
				id, int64(s.runtime.Config().Storage.MaxUploadBytes))
		} else if err != nil {
			return nil, fmt.Errorf("checking the input of job %s: %w", id, err)
		}
		if err := s.claim(ctx, account, id); err != nil {
			return nil, err
		}
		next := cloneJob(j)
		now := time.Now().UTC()
		next.Status = StatusProcessing
		next.Run++
		next.Attempt, next.Worker, next.HeartbeatAt = 0, "", nil
		next.ActualTokens, next.StartedAt, next.CompletedAt, next.Error = nil, &now, nil, ""
		// A run stopped by an unavailable model keeps its checkpoint (its
		// parts and counts, Resumable stays set until the job ends again);
		// any other failed run's parts are deleted by the worker that
		// takes up this run, and are listed as leftovers until then.
		if next.Resumable {
			next.Progress.Afforded = false // the run asks the balance again
		} else {
			next.RequestsTotal, next.RequestsCompleted, next.RequestsFailed, next.EstimatedTokens = 0, 0, 0, 0
			next.Leftovers = append(next.Leftovers, next.Progress.Parts...)
			next.Progress = Progress{}
		}
		data, err := json.Marshal(next)
		if err != nil {
			s.release(ctx, account, id)
			return nil, fmt.Errorf("encoding job %s: %w", id, err)
		}
		_, err = s.jobs.Update(ctx, jobKey(account, id), data, rev)
		if err != nil {
			s.release(ctx, account, id)
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && try < 3 {
				continue
			}
			return nil, fmt.Errorf("starting job %s: %w", id, err)
		}
		if j.Status == StatusPending {
			s.unmarkPending(ctx, account, id)
		}
		if err := s.enqueue(ctx, next, fmt.Sprintf("%s.%d", id, next.Run)); err != nil {
			s.abandonStart(account, id, err)
			return nil, fmt.Errorf("queueing job %s: %w", id, err)
		}
		return next, nil
	}
}

// abandonStart fails a job that was marked processing but could not be
// queued, so the client can start it again.
func (s *Service) abandonStart(account, id string, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j, rev, err := s.load(ctx, account, id)
	if err == nil && j.Status == StatusProcessing {
		now := time.Now().UTC()
		j.Status, j.Error, j.CompletedAt = StatusFailed, "the job could not be queued ("+cause.Error()+"): start it again", &now
		if data, err := json.Marshal(j); err == nil {
			_, err = s.jobs.Update(ctx, jobKey(account, id), data, rev)
			if err != nil {
				s.logf("batch: job %s is processing but not queued; the reaper queues it: %v", id, err)
			}
		}
	}
	s.release(ctx, account, id)
}

// enqueue puts a run of j on the work queue. msgID makes a repeated
// publish of the same run a no-op.
func (s *Service) enqueue(ctx context.Context, j *Job, msgID string) error {
	data, err := json.Marshal(workMessage{Key: jobKey(j.Account, j.ID), Run: j.Run})
	if err != nil {
		return err
	}
	_, err = s.js.Publish(ctx, workSubjectPrefix+j.ID, data, jetstream.WithMsgID(msgID))
	return err
}

// claim takes the account's processing slot for job id: a KV create, which
// exactly one of several gateways starting jobs of one account at once
// wins. A marker that no longer stands for a processing job is cleared
// first (see markerStale).
func (s *Service) claim(ctx context.Context, account, id string) error {
	key := accountToken(account)
	value, err := json.Marshal(activeMarker{JobID: id, Since: time.Now().UTC()})
	if err != nil {
		return err
	}
	for range 5 {
		_, err := s.active.Create(ctx, key, value)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("claiming the account's active job: %w", err)
		}
		entry, err := s.active.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return fmt.Errorf("reading the account's active job: %w", err)
		}
		stale, holder, err := s.markerStale(ctx, account, entry.Value())
		if err != nil {
			return err
		}
		if !stale {
			if holder == id {
				e := apiError(ErrConflict, "job %s is being started by another request", id)
				e.Passing = true
				return e
			}
			return apiError(ErrConflict, "job %s of this account is processing, and an account runs one job at a time: start job %s once it is completed or failed (GET /v1/batch/%s)", holder, id, holder)
		}
		err = s.active.Delete(ctx, key, jetstream.LastRevision(entry.Revision()))
		if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("clearing the account's finished job: %w", err)
		}
	}
	e := apiError(ErrConflict, "other jobs of this account are being started at the same time; try again")
	e.Passing = true
	return e
}

// markerStale reports whether an active marker no longer holds the slot:
// its job was deleted or completed, or it failed after the marker was set,
// or — for a job still pending or failed before — the marker is older than
// a start takes (the start died half way). A young marker of a pending job
// is a start in progress and holds.
func (s *Service) markerStale(ctx context.Context, account string, value []byte) (stale bool, holder string, err error) {
	var m activeMarker
	if err := json.Unmarshal(value, &m); err != nil || m.JobID == "" {
		return true, "", nil
	}
	j, _, err := s.load(ctx, account, m.JobID)
	if errors.Is(err, ErrNotFound) {
		return true, m.JobID, nil
	}
	if err != nil {
		return false, m.JobID, err
	}
	switch {
	case j.Status == StatusProcessing:
		return false, m.JobID, nil
	case j.Status == StatusCompleted:
		return true, m.JobID, nil
	case j.Status == StatusFailed && j.CompletedAt != nil && !j.CompletedAt.Before(m.Since):
		return true, m.JobID, nil
	}
	return time.Since(m.Since) > s.t.startGrace, m.JobID, nil
}

// release frees the account's slot if job id holds it.
func (s *Service) release(ctx context.Context, account, id string) {
	key := accountToken(account)
	entry, err := s.active.Get(ctx, key)
	if err != nil {
		return
	}
	var m activeMarker
	if json.Unmarshal(entry.Value(), &m) != nil || m.JobID != id {
		return
	}
	if err := s.active.Delete(ctx, key, jetstream.LastRevision(entry.Revision())); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		s.logf("batch: releasing the active job of %s: %v (the next start clears it)", account, err)
	}
}

// cloneJob returns a deep copy of j.
func cloneJob(j *Job) *Job {
	data, err := json.Marshal(j)
	if err != nil {
		panic(fmt.Sprintf("batch: a job record does not encode: %v", err)) // every field is plain data
	}
	c, err := decodeJob(data)
	if err != nil {
		panic(fmt.Sprintf("batch: a job record does not decode: %v", err))
	}
	return c
}

// uploadFormExpiry is when j's upload form stops working: as the job
// says, or, for a job made before it said so, storage.upload_ttl after
// its creation.
func (s *Service) uploadFormExpiry(j *Job) time.Time {
	if j.UploadExpiresAt != nil {
		return *j.UploadExpiresAt
	}
	return j.CreatedAt.Add(s.runtime.Config().Storage.UploadTTL)
}
