// Package batch runs batch classification jobs (spec 2.1-2.3, 3, 4.3-4.9).
//
// A job is a record in JetStream KV. Starting it claims the account's one
// processing slot with a KV create (atomic across gateways) and puts the
// job on a JetStream work queue; any gateway, or `tollgate worker`, takes
// it from there. The worker streams the input from object storage line by
// line, classifies lines with bounded concurrency, and streams the results,
// in input order, into parts of the output; after each part it saves a
// checkpoint in the record. A worker that dies stops renewing its claim on
// the work message, so JetStream hands the job to another worker, which
// resumes from the checkpoint: no line is lost, none is written twice.
// When the job completes its parts are joined into one results file and
// the job is billed once, through the meter, at batch.price_per_token.
package batch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/storage"
)

// JetStream names.
const (
	// JobsBucket holds job records, key <account>.<job_id>.
	JobsBucket = "TOLLGATE_BATCH_JOBS"
	// jobsStream is JobsBucket's stream, and jobSubjectPrefix + a job's
	// key the subject of its record there.
	jobsStream       = "KV_" + JobsBucket
	jobSubjectPrefix = "$KV." + JobsBucket + "."
	// ActiveBucket holds, per account, the job that is processing: the one
	// active job rule (spec section 8).
	ActiveBucket = "TOLLGATE_BATCH_ACTIVE"
	// WorkStream is the work queue, one subject per job.
	WorkStream = "BATCH_WORK"
	// workSubjectPrefix + job id is a job's work subject.
	workSubjectPrefix = "batch.work."
	// workerConsumer is the durable consumer every worker pulls from.
	workerConsumer = "batch-workers"
	// CreatedStream holds a marker of every job created in the last hour,
	// what batch.max_jobs_created_per_hour counts (broker.CreationLog).
	CreatedStream = "BATCH_CREATED"
	// createdSubjectPrefix + an account id is its markers' subject.
	createdSubjectPrefix = "batch.created."
)

// Errors of the API calls. Each is wrapped in an *Error whose message is
// written for the client.
var (
	// ErrNotFound: no job of this account has this id. Another account's
	// job is not found either: it is never visible.
	ErrNotFound = errors.New("batch job not found")
	// ErrConflict: the job's state does not allow the call (spec section
	// 3); the message says what would.
	ErrConflict = errors.New("batch job state does not allow this")
	// ErrNoInput: start found no input file; upload it to the job's
	// upload_url with its upload_fields (spec 4.4), then start again.
	ErrNoInput = errors.New("batch input not uploaded")
	// ErrCreatedTooFast: the account created batch.max_jobs_created_per_hour
	// jobs in the last hour; the *Error's RetryAfter says when it can
	// create the next.
	ErrCreatedTooFast = errors.New("too many batch jobs created in the last hour")
	// ErrEngineUnavailable, wrapped by an Engine's error, means the engine
	// cannot answer any line now (its upstream is down or overloaded). The
	// job's lines pause together and one retries with backoff (outage),
	// and the job fails when the engine stays away; the client starts
	// the job again later.
	ErrEngineUnavailable = errors.New("classification engine unavailable")
)

// UnavailableError is an ErrEngineUnavailable that says how long the
// engine asked to be left alone: its upstream's Retry-After. The job's
// lines wait at least that long before one asks again.
type UnavailableError struct {
	Msg        string
	RetryAfter time.Duration // 0: the engine said nothing
}

func (e *UnavailableError) Error() string { return ErrEngineUnavailable.Error() + ": " + e.Msg }
func (e *UnavailableError) Unwrap() error { return ErrEngineUnavailable }

// Error is an API error: Kind is one of the errors above, Msg the message
// for the client.
type Error struct {
	Kind error
	Msg  string
	// Passing: a conflict with another request racing this one, which
	// asking again at once settles. Every other conflict stands until the
	// client does something else (waits for the job, deletes it, starts
	// it or another), and is answered so that the OpenAI SDKs do not
	// retry it.
	Passing bool
	// RetryAfter is how long an ErrCreatedTooFast asks the client to wait.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

func apiError(kind error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Runtime is what jobs need from the gateway: the configuration in force
// (it reloads while jobs run) and the engine a job's lines run on. The
// plugins module provides it to its Batch.Open.
type Runtime interface {
	Config() *config.Config
	// Engine returns the engine for job, from its Model and KeyModels and
	// the configuration in force. An error fails the job with its message.
	Engine(job *Job) (Engine, error)
	// CanPay says whether account can spend cost and stay within the
	// grace buffer, and its balance.
	CanPay(account string, cost money.Nanos) (balance money.Nanos, ok bool)
	// Debited is the sum of every debit of account so far, as this
	// process last saw it; false when it has not seen the account.
	Debited(account string) (money.Nanos, bool)
	// NoteCharge counts a job's bill against the balance this process
	// admits calls and jobs on, until the account's debits show it.
	NoteCharge(account string, cost money.Nanos)
}

// Engine classifies the lines of one job. It is called from many
// goroutines at once. An error wrapping ErrEngineUnavailable is retried;
// any other fails only its line, with the error's message written into the
// results, so it must not name internal addresses. With an error, the
// Answer still carries what the line cost (Usage and Spent): a model
// that answered something else than asked was paid for upstream.
type Engine interface {
	Classify(ctx context.Context, req classifiers.ClassifyRequest) (Answer, error)
}

// Answer is one line's classification, described and billed as
// /v1/classify describes and bills the same call made alone.
type Answer struct {
	classifiers.ClassifyResult
	// Fallback says why the llm was wanted and an offline engine
	// answered (plugins.engine auto), as /v1/classify's fallback; ""
	// otherwise.
	Fallback string
	// Spent is the part of Usage a catalog model spent: all of it when
	// the llm answered, the failed attempt's when an offline engine
	// answered after it, none offline.
	Spent ModelPart
}

// ModelPart is the tokens a catalog model spent on a line, and whose
// they were: the job's event names the model and the upstream, and the
// tokens cost at least what the model's own prices make of them.
type ModelPart struct {
	Model    string // catalog id
	Upstream string // the upstream (pool member) that answered the call
	Usage    classifiers.Usage
	// Cost is what the model's prices (models[].pricing) make of Usage;
	// 0 when Usage is empty.
	Cost money.Nanos
}

// Options configures Open.
type Options struct {
	// Replicas of the buckets and the stream (broker.Replicas).
	Replicas int
	Runtime  Runtime
	// Recorder receives one event per completed job. It must drop an event
	// whose ID it has already taken (the JetStream publisher does, through
	// Nats-Msg-Id): a worker that dies between billing and recording the
	// completion bills again, with the same event ID. A
	// meter.DurableRecorder has the event safe from a crash before the
	// completion is recorded (waiting at most 2 s).
	Recorder meter.Recorder
	Logf     func(format string, args ...any)
	// Name identifies this process in job records; default host:pid.
	Name string
	// AckWait is how long a worker that stopped renewing its claim on a
	// job (it died, or lost NATS) keeps it before another worker takes it
	// over. Default 30s.
	AckWait time.Duration

	tuning tuning
}

// tuning holds timings tests shorten (see export_test.go).
type tuning struct {
	startGrace    time.Duration // a fresh active marker may be a start in progress
	heartbeat     time.Duration // record heartbeat and work message renewal
	checkpointAge time.Duration // longest time between checkpoints
	staleAfter    time.Duration // a processing job silent this long, with no work message, is queued again
	reapEvery     time.Duration
	// abandonedAfter: a pending job without input is deleted this long
	// after its upload form expired (AbandonedAfter).
	abandonedAfter time.Duration
	retryBackoff   time.Duration // first wait after ErrEngineUnavailable; doubles
	retries        int
	maxAttempts    int // workers taking up one run before it fails
	hook           func(point string) bool
	// jobRetention, when set, stands for batch.job_retention, which
	// cannot be under an hour.
	jobRetention time.Duration
	// unwrittenFor: an indexed id whose record is missing is taken for a
	// job being created while the id is this young (newest.go).
	unwrittenFor time.Duration
}

const (
	// maxRequestBytes bounds a job's labels, descriptions and examples as
	// stored in its record (NATS messages default to at most 1MiB).
	maxRequestBytes = 256 << 10
	// listLength is spec 4.6's 20 most recent jobs.
	listLength = 20
	// workDuplicates is how long the work stream remembers message ids.
	workDuplicates = 2 * time.Minute
)

// Service is the batch job store, queue and worker of one process. It is
// safe for concurrent use.
type Service struct {
	js      jetstream.JetStream
	jobs    jetstream.KeyValue
	jobsLog jetstream.Stream // the stream behind jobs, for what KV cannot do
	active  jetstream.KeyValue
	newest  jetstream.KeyValue // the ids of each account's newest jobs (newest.go)
	// replicated: the buckets have replicas, whose direct gets may
	// answer a value a few milliseconds old.
	replicated bool
	work       jetstream.Stream
	pending    jetstream.Stream    // markers of the pending jobs (pending.go)
	created    *broker.CreationLog // jobs made in the last hour, per account
	store      storage.Store
	runtime    Runtime
	recorder   meter.Recorder
	logf       func(string, ...any)
	name       string
	ackWait    time.Duration
	t          tuning
	swept      sweep // the retention reaper's state (retention.go)
}

// Open declares the buckets and the work stream (idempotent, so every
// process calls it at start) and returns the service. Workers run only
// once RunWorker is called.
func Open(ctx context.Context, js jetstream.JetStream, store storage.Store, opts Options) (*Service, error) {
	if opts.Runtime == nil || opts.Recorder == nil || store == nil {
		return nil, errors.New("batch: Open needs a store, a Runtime and a Recorder")
	}
	replicas := max(opts.Replicas, 1)
	s := &Service{js: js, store: store, runtime: opts.Runtime, recorder: opts.Recorder, logf: opts.Logf, name: opts.Name,
		ackWait: opts.AckWait, t: opts.tuning, replicated: replicas > 1}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if s.name == "" {
		host, _ := os.Hostname()
		s.name = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if s.ackWait <= 0 {
		s.ackWait = 30 * time.Second
	}
	s.t.defaults(s.ackWait)
	var err error
	s.jobs, err = broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: JobsBucket, Description: "tollgate batch jobs, key <account>.<job_id>",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return nil, err
	}
	if s.jobsLog, err = js.Stream(ctx, jobsStream); err != nil {
		return nil, fmt.Errorf("opening the stream of %s: %w", JobsBucket, err)
	}
	s.active, err = broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: ActiveBucket, Description: "tollgate batch: the processing job of each account",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return nil, err
	}
	s.newest, err = broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: NewestBucket, Description: "tollgate batch: the ids of each account's newest jobs, key <account>",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return nil, err
	}
	s.work, err = broker.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: WorkStream, Description: "tollgate batch jobs to process, subject batch.work.<job_id>",
		Subjects: []string{workSubjectPrefix + "*"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Replicas: replicas, Duplicates: workDuplicates,
	})
	if err != nil {
		return nil, err
	}
	s.pending, err = broker.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: PendingStream, Description: "tollgate batch: a marker per pending job, subject batch.pending.<account>.<job_id>",
		Subjects: []string{pendingSubjectPrefix + ">"}, MaxMsgsPerSubject: 1,
		Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return nil, err
	}
	s.created, err = broker.EnsureCreationLog(ctx, js, CreatedStream,
		"tollgate batch: a marker per job created in the last hour, subject batch.created.<account>",
		createdSubjectPrefix, replicas, 0)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (t *tuning) defaults(ackWait time.Duration) {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&t.startGrace, 30*time.Second)
	def(&t.heartbeat, min(10*time.Second, ackWait/3))
	def(&t.checkpointAge, 10*time.Second)
	def(&t.staleAfter, max(5*time.Minute, 4*ackWait))
	def(&t.reapEvery, time.Minute)
	def(&t.abandonedAfter, AbandonedAfter)
	def(&t.retryBackoff, time.Second)
	def(&t.unwrittenFor, 10*time.Second)
	if t.retries <= 0 {
		t.retries = 5
	}
	if t.maxAttempts <= 0 {
		t.maxAttempts = 10
	}
}

// at calls the test hook; true means "die here": the worker stops at once,
// as if killed, without another write.
func (s *Service) at(point string) bool {
	return s.t.hook != nil && s.t.hook(point)
}
