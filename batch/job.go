package batch

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/tollgate/tollgate/classifiers"
)

// Status is a job's state (spec section 3).
type Status string

const (
	StatusPending    Status = "pending"
	StatusProcessing Status = "processing"
	StatusCompleted  Status = "completed"
	StatusFailed     Status = "failed"
)

// Request is what a job asks of every line: the fields of batch creation
// (spec 4.3), validated and with a saved classifier already filled in.
type Request struct {
	Labels       []string            `json:"labels"`
	Descriptions map[string]string   `json:"descriptions,omitempty"`
	Examples     map[string][]string `json:"examples,omitempty"`
	TextType     string              `json:"text_type,omitempty"`
	Mode         classifiers.Mode    `json:"mode"`
	Threshold    float64             `json:"threshold"`
}

// classify is the request for one line's text.
func (r *Request) classify(text string) classifiers.ClassifyRequest {
	return classifiers.ClassifyRequest{
		Text: text, Labels: r.Labels, Descriptions: r.Descriptions, Examples: r.Examples,
		TextType: r.TextType, Mode: r.Mode, Threshold: r.Threshold,
	}
}

// Job is a job's record, the value of its key in the TOLLGATE_BATCH_JOBS
// bucket. Every change is a compare-and-set on the key's revision, so two
// gateways (or a worker taking over from one that died) never overwrite
// each other.
type Job struct {
	ID      string `json:"id"` // UUIDv7: ids sort by creation time
	Account string `json:"account"`
	KeyID   string `json:"key_id"`
	// KeyModels is the creating key's model list (empty: every model), so
	// the worker only prompts a model the key may use.
	KeyModels []string `json:"key_models,omitempty"`
	Status    Status   `json:"status"`

	// Classifier names the saved classifier Request was filled from.
	Classifier string  `json:"classifier,omitempty"`
	Request    Request `json:"request"`
	// Model is the engine or model asked for: "lexical", "llm", a catalog
	// id, or "" for plugins.engine at the time the job runs.
	Model string `json:"model,omitempty"`
	// Price is USD per token, batch.price_per_token when the job was
	// created: the price the client saw is the price billed.
	Price string `json:"price"`

	InputKey string `json:"input_key"`
	// UploadExpiresAt is when the job's upload form stops working (nil on
	// jobs of older releases): storage.upload_ttl reloads, so it cannot be
	// worked out later.
	UploadExpiresAt *time.Time `json:"upload_expires_at,omitempty"`
	OutputKey       string     `json:"output_key,omitempty"` // set when completed

	RequestsTotal     int64      `json:"requests_total"`
	RequestsCompleted int64      `json:"requests_completed"`
	RequestsFailed    int64      `json:"requests_failed"`
	EstimatedTokens   int64      `json:"estimated_tokens"`
	ActualTokens      *int64     `json:"actual_tokens,omitempty"`
	CreatedAt         time.Time  `json:"created_at"`
	StartedAt         *time.Time `json:"started_at,omitempty"`
	CompletedAt       *time.Time `json:"completed_at,omitempty"`
	Error             string     `json:"error,omitempty"`

	// Run counts starts; a work message names the run it is for, so a
	// message left from an earlier run is recognised and dropped.
	Run int `json:"run"`
	// Attempt counts the workers that took up the current run.
	Attempt int `json:"attempt,omitempty"`
	// Worker names the process holding the run, for operators.
	Worker      string     `json:"worker,omitempty"`
	HeartbeatAt *time.Time `json:"heartbeat_at,omitempty"`
	Progress    Progress   `json:"progress"`
	// Billed is set in the same write that completes the job.
	Billed bool `json:"billed,omitempty"`
	// BilledAt is the time of the job's usage event, saved before the
	// event is recorded and kept ever after (a new run does not clear
	// it): every bill of the job carries it, so ClickHouse, which keys
	// rows by their UTC day, keeps one row however often the job is
	// billed. Nil until the job first bills.
	BilledAt *time.Time `json:"billed_at,omitempty"`
	// DebitedBeforeBill is the account's total of debits when the job
	// billed itself: once the total has grown by the job's cost, its bill
	// is in the balance (recentlyBilled). Unknown (nil) on jobs of older
	// releases, or when this process had not seen the account.
	DebitedBeforeBill *int64 `json:"debited_before_bill_nanos,omitempty"`
	// BilledBy names the process (Options.Name) that billed the job: the
	// bill counts in that process's balances until debited, and only in
	// the others' through recentlyBilled.
	BilledBy string `json:"billed_by,omitempty"`
	// StopBills are the bills of the lines done before a run stopped
	// resumable (the balance could not pay, the model stayed down), or
	// failed because its input was uploaded again (Final), one
	// per stop that had lines to bill, each charging what the job did
	// since the bill before; the completion's bill charges the rest, so
	// a line is billed once however often the job stops and resumes. A
	// run of another input (uploaded again) is billed from its first line,
	// the earlier input's stop bills staying charged (StopBill.forInput).
	// Unbilled, a job stopped after its lines ran upstream could be
	// deleted, and made again, at the operator's cost.
	StopBills []StopBill `json:"stop_bills,omitempty"`
	// Resumable: the run stopped because its model's upstream stayed
	// unavailable, with its checkpoint intact. Starting the job again goes
	// on from the checkpoint instead of the first line, so the lines
	// before it are not asked again (those after it the upstream answered
	// before the run stopped are).
	Resumable bool `json:"resumable,omitempty"`
	// Deleting: a DELETE began and has not finished (a file could not be
	// deleted). The job cannot start, nor give its results; the next
	// DELETE finishes.
	Deleting bool `json:"deleting,omitempty"`
	// Leftovers are the parts of earlier runs, deleted by the worker that
	// takes up the next run, or with the job.
	Leftovers []Segment `json:"leftovers,omitempty"`
}

// StopBill is the bill of a stop: its usage event's id (the job id, then
// ".1", ".2"… in order) and time, saved before the event is recorded, and
// what it charged. Recorded is set once the event is: a worker that dies
// in between leaves it unset, and the worker taking over records the
// same event again, which ClickHouse and the debit take once.
type StopBill struct {
	ID       string    `json:"id"`
	At       time.Time `json:"at"`
	Recorded bool      `json:"recorded,omitempty"`
	// Stop is the error the job stops with, for the worker taking over.
	Stop string `json:"stop,omitempty"`
	// Final: the job fails for good (its input changed), rather than
	// stopping resumable; starting it again runs it from its first line.
	Final bool `json:"final,omitempty"`
	// InputSize and InputVersion are the input whose lines the bill
	// charged (Progress's when it stopped): only a run of that input
	// leaves them out of its own bills (see forInput).
	InputSize    int64  `json:"input_size,omitempty"`
	InputVersion string `json:"input_version,omitempty"`
	// BilledBy and DebitedBeforeBill are the completion's (Job's) for
	// this bill: the process that made it, in whose balance it counts
	// until debited, and the account's total of debits then; other
	// processes count it through recentlyBilled. Unset on bills of older
	// releases.
	BilledBy          string `json:"billed_by,omitempty"`
	DebitedBeforeBill *int64 `json:"debited_before_bill_nanos,omitempty"`
	Charge
}

// forInput says whether the stop billed lines of the input p counted. A
// stop's bill of an input uploaded again is spent: the lines it charged
// ran on the model, and the new input's, from line 1, are other lines
// (left out of its bills, 40 new lines after 168 billed cost 0). Bills
// of releases that kept no input count for every input, as they did.
func (b *StopBill) forInput(p *Progress) bool {
	if b.InputSize == 0 && b.InputVersion == "" {
		return true
	}
	return b.InputSize == p.InputSize && b.InputVersion == p.InputVersion
}

// Charge is what a bill charges: token sums and cost.
type Charge struct {
	PromptTokens     int64 `json:"prompt_tokens,omitempty"`
	CompletionTokens int64 `json:"completion_tokens,omitempty"`
	CachedTokens     int64 `json:"cached_tokens,omitempty"`
	ReasoningTokens  int64 `json:"reasoning_tokens,omitempty"`
	TotalTokens      int64 `json:"total_tokens,omitempty"`
	CostNanos        int64 `json:"cost_nanos,omitempty"`
}

func (c Charge) zero() bool { return c == Charge{} }

// plus is c and d together.
func (c Charge) plus(d Charge) Charge {
	return Charge{
		PromptTokens:     c.PromptTokens + d.PromptTokens,
		CompletionTokens: c.CompletionTokens + d.CompletionTokens,
		CachedTokens:     c.CachedTokens + d.CachedTokens,
		ReasoningTokens:  c.ReasoningTokens + d.ReasoningTokens,
		TotalTokens:      c.TotalTokens + d.TotalTokens,
		CostNanos:        c.CostNanos + d.CostNanos,
	}
}

// Progress is the checkpoint of the current run: the input up to Offset
// (Lines lines) is done and its results are in Parts, in order.
type Progress struct {
	// Counted: the counting pass filled RequestsTotal, EstimatedTokens and
	// InputSize.
	Counted bool `json:"counted,omitempty"`
	// Afforded: this run checked that the account can pay the job's
	// estimate. A run that resumes a stopped one keeps the count but
	// checks again: the whole job is billed when it completes.
	Afforded  bool  `json:"afforded,omitempty"`
	InputSize int64 `json:"input_size,omitempty"`
	// InputVersion is the input's storage.Info.Version when it was counted:
	// an input replaced by one of the same size changes it.
	InputVersion string    `json:"input_version,omitempty"`
	Offset       int64     `json:"offset,omitempty"`
	Lines        int64     `json:"lines,omitempty"`
	Parts        []Segment `json:"parts,omitempty"`
	// Token sums over the lines done, billed at completion.
	PromptTokens     int64 `json:"prompt_tokens,omitempty"`
	CompletionTokens int64 `json:"completion_tokens,omitempty"`
	TotalTokens      int64 `json:"total_tokens,omitempty"`
	// CachedTokens and ReasoningTokens are the parts of PromptTokens and
	// CompletionTokens llm lines' upstreams reported cached and
	// reasoning; the bill carries them as a /v1/classify event does.
	CachedTokens    int64 `json:"cached_tokens,omitempty"`
	ReasoningTokens int64 `json:"reasoning_tokens,omitempty"`
	// Estimated: some llm lines were counted by the tokenizer, their
	// upstream having reported no usage to believe; the bill says so.
	Estimated bool `json:"estimated,omitempty"`
	// ModelTokens is the part of TotalTokens a catalog model spent, and
	// ModelCostNanos what they cost, line by line the higher of the job's
	// price and the model's own prices, as /v1/classify bills them.
	ModelTokens    int64 `json:"model_tokens,omitempty"`
	ModelCostNanos int64 `json:"model_cost_nanos,omitempty"`
	// LLMModel is the model that spent tokens on lines, answering them or
	// failing before an offline engine answered (auto); "" while none
	// did. LLMUpstream is the upstream (pool member) that answered its
	// first such line.
	LLMModel    string `json:"llm_model,omitempty"`
	LLMUpstream string `json:"llm_upstream,omitempty"`
	// OfflineEngine is the offline engine that answered lines (semantic
	// or lexical), "" while none did: the model a job answered offline is
	// billed under.
	OfflineEngine string `json:"offline_engine,omitempty"`
	// FirstError is the first line's error, quoted when no line succeeds.
	FirstError string `json:"first_error,omitempty"`
}

// Keys. A KV key is <account>.<job_id> with the account's dots written as
// '=' (account ids allow dots; '=' is allowed in keys but not in account
// ids), so the filter <account>.* lists one account's jobs and never those
// of an account whose id only starts the same.

func accountToken(account string) string { return strings.ReplaceAll(account, ".", "=") }

// accountOfToken is the account accountToken wrote token for.
func accountOfToken(token string) string { return strings.ReplaceAll(token, "=", ".") }

func jobKey(account, id string) string { return accountToken(account) + "." + id }

// Object keys: everything of a job lives under batch/<account>/<job_id>/.
func inputObject(account, id string) string { return "batch/" + account + "/" + id + "/input.ndjson" }

// A run's attempt writes its parts and results under r<run>a<attempt>/,
// so a worker that lost the job (it stalled, another took over) can never
// overwrite what its successor wrote.
func partObject(account, id string, run, attempt, seq int) string {
	return fmt.Sprintf("batch/%s/%s/r%da%d/part-%06d.ndjson", account, id, run, attempt, seq)
}

func resultObject(account, id string, run, attempt int) string {
	return fmt.Sprintf("batch/%s/%s/r%da%d/results.ndjson", account, id, run, attempt)
}

// Segment is consecutive parts written by one attempt: sequence numbers
// First to First+Count-1. A run's parts, in order, are its segments' parts
// in order; the record stays small however many parts a job has.
type Segment struct {
	Run     int `json:"run"`
	Attempt int `json:"attempt"`
	First   int `json:"first"`
	Count   int `json:"count"`
}

// partKeys lists the object keys of segs, in order.
func (j *Job) partKeys(segs []Segment) []string {
	var keys []string
	for _, sg := range segs {
		for seq := sg.First; seq < sg.First+sg.Count; seq++ {
			keys = append(keys, partObject(j.Account, j.ID, sg.Run, sg.Attempt, seq))
		}
	}
	return keys
}

// addPart appends part seq of the current attempt to the run's segments.
func (p *Progress) addPart(run, attempt, seq int) {
	if n := len(p.Parts); n > 0 {
		last := &p.Parts[n-1]
		if last.Run == run && last.Attempt == attempt && last.First+last.Count == seq {
			last.Count++
			return
		}
	}
	p.Parts = append(p.Parts, Segment{Run: run, Attempt: attempt, First: seq, Count: 1})
}

// nextSeq is the sequence number of the run's next part.
func (p *Progress) nextSeq() int {
	n := 1
	for _, sg := range p.Parts {
		n = max(n, sg.First+sg.Count)
	}
	return n
}

// validJobID accepts the canonical form of a UUID, the only form ids are
// handed out in; anything else cannot name a job (and must not reach a KV
// key or an object path).
func validJobID(id string) bool {
	u, err := uuid.Parse(id)
	return err == nil && u.String() == id
}

// TimeFormat is how the batch API writes every time: ISO 8601 in UTC
// with milliseconds.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

func formatTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := t.UTC().Format(TimeFormat)
	return &s
}

// View is a job as GET /v1/batch/{job_id} shows it (spec 2.1). Times not
// reached yet, actual_tokens before completion and error outside failure
// are null. completed_at is when the job ended, completed or failed.
type View struct {
	JobID             string  `json:"job_id"`
	Status            Status  `json:"status"`
	RequestsTotal     int64   `json:"requests_total"`
	RequestsCompleted int64   `json:"requests_completed"`
	RequestsFailed    int64   `json:"requests_failed"`
	EstimatedTokens   int64   `json:"estimated_tokens"`
	ActualTokens      *int64  `json:"actual_tokens"`
	CreatedAt         string  `json:"created_at"`
	StartedAt         *string `json:"started_at"`
	CompletedAt       *string `json:"completed_at"`
	Error             *string `json:"error"`
}

// View returns the spec's representation of j.
func (j *Job) View() View {
	v := View{
		JobID: j.ID, Status: j.Status,
		RequestsTotal: j.RequestsTotal, RequestsCompleted: j.RequestsCompleted, RequestsFailed: j.RequestsFailed,
		EstimatedTokens: j.EstimatedTokens, CreatedAt: *formatTime(&j.CreatedAt),
		StartedAt: formatTime(j.StartedAt), CompletedAt: formatTime(j.CompletedAt),
	}
	if j.Status == StatusCompleted {
		v.ActualTokens = j.ActualTokens
	}
	if j.Status == StatusFailed {
		msg := j.Error
		v.Error = &msg
	}
	return v
}

// ListItem is a job in GET /v1/batch (spec 2.1, list representation).
type ListItem struct {
	JobID             string `json:"job_id"`
	Status            Status `json:"status"`
	RequestsTotal     int64  `json:"requests_total"`
	RequestsCompleted int64  `json:"requests_completed"`
	CreatedAt         string `json:"created_at"`
}

// ListItem returns the list representation of j.
func (j *Job) ListItem() ListItem {
	return ListItem{JobID: j.ID, Status: j.Status, RequestsTotal: j.RequestsTotal,
		RequestsCompleted: j.RequestsCompleted, CreatedAt: *formatTime(&j.CreatedAt)}
}

func decodeJob(data []byte) (*Job, error) {
	var j Job
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("decoding batch job record: %w", err)
	}
	return &j, nil
}

// workMessage is a work queue entry: run Run of the job under Key.
type workMessage struct {
	Key string `json:"key"`
	Run int    `json:"run"`
}

// activeMarker is the value of an account's key in TOLLGATE_BATCH_ACTIVE:
// the job that holds the account's one processing slot.
type activeMarker struct {
	JobID string    `json:"job_id"`
	Since time.Time `json:"since"`
}
