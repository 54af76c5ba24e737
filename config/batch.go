package config

import "time"

// Batch configures batch classification jobs (spec 4.3-4.9). Every field
// but max_jobs reloads: a job run reads them when it starts, and a job
// keeps the price in force when it was created.
type Batch struct {
	// PricePerToken is USD per token, billed once per job when it
	// completes, on its actual tokens.
	PricePerToken string `yaml:"price_per_token"`
	// Concurrency is how many lines of one job are classified at once:
	// upstream calls in flight with the llm engine.
	Concurrency int `yaml:"concurrency"`
	// CheckpointLines: a job's progress is saved (a part of the results
	// written, its record updated) after this many lines, and at least
	// every 10 seconds. A worker that dies costs at most this much redone.
	CheckpointLines int `yaml:"checkpoint_lines"`
	// MaxJobs is how many jobs one process (serve or worker) runs at once.
	// restart-only.
	MaxJobs int `yaml:"max_jobs"`
	// MaxPendingJobs is the most jobs one account may hold created and
	// not started yet; creating one more is a 409. NoLimit (-1) is no cap.
	MaxPendingJobs int `yaml:"max_pending_jobs"`
	// MaxJobsCreatedPerHour is the most jobs one account may create in
	// an hour, deleted ones included; one more is a 429. NoLimit (-1) is
	// none.
	MaxJobsCreatedPerHour int `yaml:"max_jobs_created_per_hour"`
	// JobRetention is how long a completed or failed job is kept, with
	// its files, after its record was last written (its end, or a
	// results link asked for near the end of its time); then any
	// gateway's or worker's reaper deletes it.
	JobRetention time.Duration `yaml:"job_retention"`
}

// Batch defaults; gateway.yaml documents each.
const (
	// DefaultBatchPrice is the spec's batch price, 0.08 USD per 1M tokens.
	DefaultBatchPrice           = "0.00000008"
	DefaultBatchConcurrency     = 128
	DefaultBatchCheckpointLines = 20_000
	DefaultBatchMaxJobs         = 2
	// DefaultBatchMaxPendingJobs leaves room for a client that creates a
	// job per file ahead of uploading, while keeping an account's records
	// (up to 256KiB of labels each) and the store's inputs bounded.
	DefaultBatchMaxPendingJobs = 100
	// DefaultBatchMaxJobsCreatedPerHour is a job every 3.6 s for an hour,
	// far above a client that makes a job per file, and bounds a loop of
	// create and delete to 24,000 job records a day.
	DefaultBatchMaxJobsCreatedPerHour = 1000
	// DefaultBatchJobRetention is what batch APIs keep results for (a
	// month), and bounds an account's kept jobs, and so its job list's
	// cost, to what it creates in that time.
	DefaultBatchJobRetention = 30 * 24 * time.Hour
)

// maxBatchJobRetention is about ten years: as good as forever.
const maxBatchJobRetention = 87_600 * time.Hour

func applyBatchDefaults(b *Batch) {
	setDefault(&b.PricePerToken, DefaultBatchPrice)
	setDefault(&b.Concurrency, DefaultBatchConcurrency)
	setDefault(&b.CheckpointLines, DefaultBatchCheckpointLines)
	setDefault(&b.MaxJobs, DefaultBatchMaxJobs)
	setDefault(&b.MaxPendingJobs, DefaultBatchMaxPendingJobs)
	setDefault(&b.MaxJobsCreatedPerHour, DefaultBatchMaxJobsCreatedPerHour)
	setDefault(&b.JobRetention, DefaultBatchJobRetention)
}

func (l *loader) validateBatch(b Batch, st Storage) {
	_, err := parsePrice(b.PricePerToken)
	l.check(err == nil, "batch.price_per_token", "%v (write USD per token as a quoted decimal such as \"0.00000008\")", err)
	l.checkTokenPriceCallCost("batch", "price_per_token", b.PricePerToken)
	l.check(b.Concurrency >= 1 && b.Concurrency <= 4096, "batch.concurrency", "%d is outside 1..4096", b.Concurrency)
	l.check(b.CheckpointLines >= 1 && b.CheckpointLines <= 10_000_000, "batch.checkpoint_lines", "%d is outside 1..10000000", b.CheckpointLines)
	l.check(b.MaxJobs >= 1 && b.MaxJobs <= 256, "batch.max_jobs", "%d is outside 1..256", b.MaxJobs)
	l.checkCountCap("batch.max_pending_jobs", b.MaxPendingJobs)
	l.checkPerHour("batch.max_jobs_created_per_hour", b.MaxJobsCreatedPerHour)
	l.check(!l.writtenZero("batch.job_retention"), "batch.job_retention",
		"0 is outside 1h..87600h: write how long finished jobs are kept, or leave it out for 720h (30 days)")
	l.check(b.JobRetention >= time.Hour && b.JobRetention <= maxBatchJobRetention, "batch.job_retention",
		"%s is outside 1h..87600h", b.JobRetention)
	// A results link asked for near the end keeps its job for another
	// retention: that must outlast the link.
	l.check(b.JobRetention < time.Hour || b.JobRetention >= st.DownloadTTL, "batch.job_retention",
		"%s is shorter than storage.download_ttl %s: a results link would outlive its job", b.JobRetention, st.DownloadTTL)
}
