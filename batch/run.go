package batch

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/jsoncheck"
	"github.com/tollgate/tollgate/internal/utf8cut"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/storage"
	"github.com/tollgate/tollgate/tokens"
)

// Pipeline sizes. Lines travel in chunks so the per-line cost of the
// pipeline stays small next to classifying one line with the lexical
// engine (about 20µs).
const (
	chunkLines   = 8
	chunkBytes   = 64 << 10
	readBuffer   = 256 << 10
	writeBuffer  = 256 << 10
	sampleLines  = 1000 // lines whose texts are tokenized to estimate tokens
	errorMaxText = 300  // bytes of an engine error quoted in a result line
)

// errEnded: the job ended (failed) in its record before its input did.
var errEnded = errors.New("job ended")

// maxLineBytes is the longest input line read: room for a text of
// plugins.max_text_bytes written with JSON escapes. Longer lines are
// skipped and reported, never held in memory.
func maxLineBytes(cfg *config.Config) int {
	return 4*int(cfg.Plugins.MaxTextBytes) + 1024
}

// run processes the run o holds from its checkpoint to the end. It returns
// nil once the job is completed or failed in its record, errDied or
// errLost when it must stop without another write, and any other error
// for a fault worth a retry (the run resumes from its checkpoint).
func (s *Service) run(ctx context.Context, o *owner) error {
	cfg := s.runtime.Config()
	// A worker that died stopping the job, between saving the stop's
	// bill and recording it, left both to this one.
	stop, err := s.recordStopBills(ctx, o, false)
	if err != nil {
		return err
	}
	if stop != nil {
		return o.end(ctx, stop.Stop, !stop.Final)
	}
	j := o.snapshot()
	engine, err := s.runtime.Engine(j)
	if err != nil {
		return o.fail(ctx, "the job cannot run: "+err.Error())
	}
	input, ended, err := s.checkInput(ctx, o, j, j.Progress.Counted)
	if ended || err != nil {
		return err
	}
	if !j.Progress.Counted {
		total, estimate, err := s.count(ctx, j, maxLineBytes(cfg))
		var unreadable errUnreadableInput
		if errors.As(err, &unreadable) {
			return o.fail(ctx, unreadable.Error())
		}
		if err != nil {
			return err
		}
		if err := o.update(ctx, func(j *Job) {
			j.RequestsTotal, j.EstimatedTokens = total, estimate
			j.Progress.Counted, j.Progress.InputSize, j.Progress.InputVersion = true, input.Size, input.Version
		}); err != nil {
			return err
		}
		if s.at("counted") {
			return errDied
		}
		j = o.snapshot()
	}
	if !j.Progress.Afforded {
		// A job is billed when it ends, so the account's balance is asked
		// now, against the estimate: checked only at create and start, one
		// job of a 5 GB input could overdraw an account of one cent by
		// any amount. A run resuming a stopped one asks again, for the
		// whole job less what its stops billed: it skipped the check with
		// the count, and overdrew.
		estimate, _ := jobCost(j.Price, j.EstimatedTokens)
		estimate = max(estimate-money.Nanos(j.billedByStops().CostNanos), 0)
		if refused := s.cannotPay(ctx, j, estimate, fmt.Sprintf("this job's estimated %d tokens", j.EstimatedTokens)); refused != "" {
			return o.end(ctx, refused+": top up and start the job again", j.Resumable)
		}
		if err := o.update(ctx, func(j *Job) { j.Progress.Afforded = true }); err != nil {
			return err
		}
	}
	switch err := s.classifyInput(ctx, o, engine, cfg); {
	case errors.Is(err, errEnded):
		return nil
	case err != nil:
		return err
	}
	return s.finish(ctx, o)
}

// count reads the whole input once for requests_total and
// estimated_tokens: lines are counted, texts are measured in bytes, the
// first texts are tokenized for the tokens per byte, and every line adds
// the tokens of the labels, descriptions and examples (as the lexical
// engine bills them). The llm engine's instructions and answers come on
// top, so for it the estimate is low.
func (s *Service) count(ctx context.Context, j *Job, maxLine int) (lines, estimate int64, err error) {
	rc, err := s.store.Open(ctx, j.InputKey)
	if err != nil {
		return 0, 0, fmt.Errorf("opening the input: %w", err)
	}
	defer rc.Close()
	lr := newLineReader(rc, 0, maxLine)
	var textBytes, sampleBytes, sampleTokens, sampled int64
	for {
		line, tooLong, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, 0, fmt.Errorf("reading the input at byte %d: %w", lr.offset, err)
		}
		lines++
		if lines == 1 {
			if enc := jsoncheck.UTF16Encoding(line); enc != "" {
				return 0, 0, errUnreadableInput(fmt.Sprintf("the input is %s; upload NDJSON in UTF-8 (PowerShell 5's > writes UTF-16: use Out-File -Encoding utf8)", enc))
			}
		}
		if tooLong {
			continue
		}
		// Found as the lines are classified: "Text" went uncounted, and
		// a job of such lines ran on an estimate of its labels alone.
		if t, _ := textOf(gjson.ParseBytes(line)); t.Type == gjson.String {
			textBytes += int64(len(t.Str))
			if sampled < sampleLines {
				sampled++
				sampleBytes += int64(len(t.Str))
				sampleTokens += int64(tokens.Count(t.Str))
			}
		}
		if lines%65536 == 0 && ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
	}
	if sampleBytes > 0 {
		estimate = textBytes * sampleTokens / sampleBytes
	}
	return lines, estimate + lines*labelTokens(&j.Request), nil
}

// errUnreadableInput fails a job whose input cannot be read as lines of
// UTF-8 at all, with a message saying why, instead of one error per line.
type errUnreadableInput string

func (e errUnreadableInput) Error() string { return string(e) }

// labelTokens is the tokens of a request's labels, descriptions and
// examples.
func labelTokens(r *Request) int64 {
	var b strings.Builder
	for _, l := range r.Labels {
		b.WriteString(l)
		b.WriteByte('\n')
		if d := r.Descriptions[l]; d != "" {
			b.WriteString(d)
			b.WriteByte('\n')
		}
		for _, ex := range r.Examples[l] {
			b.WriteString(ex)
			b.WriteByte('\n')
		}
	}
	return int64(tokens.Count(b.String()))
}

// chunk is consecutive input lines and, once done is closed, their
// results.
type chunk struct {
	first   int64 // line number of lines[0], from 1
	lines   [][]byte
	tooLong []bool
	end     int64 // input offset after the last line
	// err: the chunk could not be finished (the input could not be read,
	// the engine stayed unavailable, the run was stopped).
	err error

	out                       bytes.Buffer
	completed, failed         int64
	prompt, completion, total int64
	// cached and reasoning are the parts of prompt and completion an
	// llm's upstream reported cached and reasoning.
	cached, reasoning int64
	// estimated: some of the tokens are the tokenizer's count of an llm
	// call whose upstream reported none to believe.
	estimated bool
	// modelTokens is the part of total a catalog model spent, and
	// modelCost what it costs (see lineClassifier.count).
	modelTokens                       int64
	modelCost                         money.Nanos
	llmModel, llmUpstream, firstError string
	offlineEngine                     string
	done                              chan struct{}
}

// classifyInput classifies the input from the checkpoint on: one reader,
// batch.concurrency classifiers, and this goroutine writing results in
// input order, checkpointing after each part.
func (s *Service) classifyInput(ctx context.Context, o *owner, engine Engine, cfg *config.Config) error {
	j := o.snapshot()
	concurrency := max(cfg.Batch.Concurrency, 1)
	rc, err := s.store.OpenAt(ctx, j.InputKey, j.Progress.Offset)
	if err != nil {
		return fmt.Errorf("opening the input at byte %d: %w", j.Progress.Offset, err)
	}
	defer rc.Close()

	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	// order holds chunks in input order, and bounds how far reading runs
	// ahead of writing: memory stays flat whatever the input's size.
	order := make(chan *chunk, 2*concurrency)
	work := make(chan *chunk, concurrency)
	wg.Go(func() {
		s.readChunks(pctx, newLineReader(rc, j.Progress.Offset, maxLineBytes(cfg)), j.Progress.Lines, order, work)
	})
	lc := newLineClassifier(s, engine, j, cfg)
	for range concurrency {
		wg.Go(func() {
			for c := range work {
				lc.classifyChunk(pctx, c)
				close(c.done)
			}
		})
	}

	w := &partWriter{s: s, o: o, job: j, every: int64(max(cfg.Batch.CheckpointLines, 1)), seq: j.Progress.nextSeq()}
	defer w.abort()
	// askBalance: a checkpoint was saved, and the balance is asked before
	// the lines after it, if any. At the end of the input it is not: the
	// lines have run and their overdraw happened; stopped there, the job
	// billed them all, kept their results from the client, and said it
	// would go on from a line past the last.
	askBalance := false
	for c := range order {
		if askBalance {
			askBalance = false
			// Checked at each checkpoint, not only at the end: an input
			// uploaded again 5 s into a job of 3000 lines (the upload
			// form works until it expires) had every line run on the
			// model before the job failed, unbilled.
			switch _, ended, err := s.checkInput(ctx, o, o.snapshot(), true); {
			case err != nil:
				return err
			case ended:
				return errEnded
			}
			if err := s.stopIfOverdrawn(ctx, o); err != nil {
				return err
			}
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if s.at("chunk") {
			return errDied
		}
		if c.err != nil {
			if errors.Is(c.err, ErrEngineUnavailable) {
				// Every chunk before this one is done and paid for
				// upstream: checkpointed, a start resumes after it.
				if err := w.checkpoint(ctx); err != nil {
					return err
				}
				again := "when the model is back"
				var later *retryLater
				if errors.As(c.err, &later) {
					again = "after " + later.at.UTC().Format(TimeFormat)
				}
				if err := s.stopBilled(ctx, o, fmt.Sprintf("stopped at line %d: %s%s; start the job again %s: it goes on from line %d", c.first, c.err, billedBefore(c.first), again, c.first)); err != nil {
					return err
				}
				return errEnded
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return c.err
		}
		seq := w.seq
		if err := w.add(ctx, c); err != nil {
			return err
		}
		askBalance = w.seq != seq
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.checkpoint(ctx)
}

// stopIfOverdrawn stops the job, resumable, when the account cannot pay
// the tokens its lines have used since its last bill within the grace
// buffer, bills those lines, and then answers errEnded. The estimate the
// run was admitted on can be far short (its tokens per byte come from the
// first texts): asked at each checkpoint with input left, an overdraw is
// bounded by one checkpoint's lines. It must not be asked once the input
// is done: the completion bills those lines as a stop would.
func (s *Service) stopIfOverdrawn(ctx context.Context, o *owner) error {
	j := o.snapshot()
	due := j.unbilled()
	refused := s.cannotPay(ctx, j, money.Nanos(due.CostNanos), fmt.Sprintf("the %d tokens used so far", due.TotalTokens))
	if refused == "" {
		return nil
	}
	next := j.Progress.Lines + 1
	if err := s.stopBilled(ctx, o, fmt.Sprintf("stopped at line %d: %s%s: top up and start the job again; it goes on from line %d", next, refused, billedBefore(next), next)); err != nil {
		return err
	}
	return errEnded
}

// billedBefore is what a stop at line says of the lines before it: that
// they are billed, unless there are none (a job stopped at line 1 said
// so, having billed nothing).
func billedBefore(line int64) string {
	if line <= 1 {
		return ""
	}
	return "; the lines before it are billed"
}

// stopBilled stops the job, resumable, with msg, after billing the lines
// it did since its last bill: their results are kept for the run that
// resumes it, which bills only the lines after them. Left unbilled, a job
// stopped by a balance that could not pay, after its lines had run on the
// model, could be deleted and made again, each time at the operator's
// cost. The bill's id and time, and msg, are saved first, as BilledAt is
// before the completion's bill.
func (s *Service) stopBilled(ctx context.Context, o *owner, msg string) error {
	return s.endBilled(ctx, o, msg, true)
}

// failBilled fails the job with msg, as stopBilled stops it, billing the
// lines it did since its last bill, but for good: starting it again runs
// it from its first line.
func (s *Service) failBilled(ctx context.Context, o *owner, msg string) error {
	return s.endBilled(ctx, o, msg, false)
}

func (s *Service) endBilled(ctx context.Context, o *owner, msg string, resumable bool) error {
	j := o.snapshot()
	if due := j.unbilled(); !due.zero() {
		bill := StopBill{ID: fmt.Sprintf("%s.%d", j.ID, len(j.StopBills)+1), At: time.Now().UTC(), Stop: msg, Final: !resumable,
			InputSize: j.Progress.InputSize, InputVersion: j.Progress.InputVersion, Charge: due, BilledBy: s.name}
		if d, ok := s.runtime.Debited(j.Account); ok {
			bill.DebitedBeforeBill = new(int64(d))
		}
		if err := o.update(ctx, func(j *Job) { j.StopBills = append(j.StopBills, bill) }); err != nil {
			return err
		}
		if _, err := s.recordStopBills(ctx, o, true); err != nil {
			return err
		}
	}
	return o.end(ctx, msg, resumable)
}

// recordStopBills records the events of the job's stop bills not recorded
// yet, notes them recorded, and returns the last one of them (nil for
// none), whose Stop and Final say how the job ends. note counts them in
// this process's balance until debited, as the completion's bill is:
// once, by the worker that made them (noted again, a bill held the
// balance short until the process restarted).
func (s *Service) recordStopBills(ctx context.Context, o *owner, note bool) (stop *StopBill, err error) {
	j := o.snapshot()
	var recorded []string
	for _, b := range j.StopBills {
		if b.Recorded {
			continue
		}
		if !meter.RecordAndWait(s.recorder, s.billingEvent(j, b.ID, b.At, b.Charge)) {
			s.logf("batch: job %s: its bill %s is not on disk after %s; stopping it anyway", j.ID, b.ID, meter.DurableWait)
		}
		if note {
			s.runtime.NoteCharge(j.Account, money.Nanos(b.CostNanos))
		}
		recorded = append(recorded, b.ID)
		stop = &b
	}
	if len(recorded) == 0 {
		return nil, nil
	}
	if s.at("stop-billed") {
		return nil, errDied
	}
	return stop, o.update(ctx, func(j *Job) {
		for i := range j.StopBills {
			if slices.Contains(recorded, j.StopBills[i].ID) {
				j.StopBills[i].Recorded = true
			}
		}
	})
}

// cannotPay says why the account cannot pay cost, for job j, within the
// grace buffer, with the bills of its recent jobs not debited yet, or ""
// when it can. what words the tokens cost is for ("this job's estimated
// 263 tokens").
//
// A job that billed (BilledAt) is never refused: its bill, repeated with
// the same id, is charged once, so finishing it costs the account nothing
// more. Asked again, by the worker taking over from one that died after
// billing, its cost counted twice against a balance holding its bill, and
// a job the account had paid for ended failed, with no results; with the
// debit not in the balance yet, the answer depended on the consumer's lag.
func (s *Service) cannotPay(ctx context.Context, j *Job, cost money.Nanos, what string) string {
	if cost <= 0 || j.BilledAt != nil {
		return ""
	}
	recent := s.recentlyBilled(ctx, j)
	balance, ok := s.runtime.CanPay(j.Account, cost+recent)
	if ok {
		return ""
	}
	msg := fmt.Sprintf("the account's balance of %s USD cannot pay %s (%s USD) within the grace buffer", balance, what, cost)
	if recent > 0 {
		msg += fmt.Sprintf(", with %s USD of its jobs' bills of the last %s that are not debited yet", recent, recentBillWindow)
	}
	return msg
}

// readChunks reads lines into chunks until the input ends or ctx does.
// A read error travels as a last chunk with err set.
func (s *Service) readChunks(ctx context.Context, lr *lineReader, linesDone int64, order, work chan<- *chunk) {
	defer close(order)
	defer close(work)
	next := linesDone + 1
	for {
		c := &chunk{first: next, done: make(chan struct{})}
		size := 0
		var readErr error
		for len(c.lines) < chunkLines && size < chunkBytes {
			line, tooLong, err := lr.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				readErr = fmt.Errorf("reading the input at byte %d: %w", lr.offset, err)
				break
			}
			c.lines = append(c.lines, bytes.Clone(line))
			c.tooLong = append(c.tooLong, tooLong)
			size += len(line)
		}
		c.end = lr.offset
		next += int64(len(c.lines))
		last := readErr != nil || len(c.lines) < chunkLines && size < chunkBytes
		if readErr != nil && len(c.lines) == 0 {
			c.err = readErr
			close(c.done)
			select {
			case order <- c:
			case <-ctx.Done():
			}
			return
		}
		if len(c.lines) > 0 {
			select {
			case order <- c:
			case <-ctx.Done():
				return
			}
			select {
			case work <- c:
			case <-ctx.Done():
				return
			}
		}
		if readErr != nil {
			c := &chunk{first: next, err: readErr, done: make(chan struct{})}
			close(c.done)
			select {
			case order <- c:
			case <-ctx.Done():
			}
			return
		}
		if last {
			return
		}
	}
}

// partWriter streams results into the run's current part and saves a
// checkpoint after each: the part is committed first, then the record
// names it with the input offset and counters it covers. A worker that
// dies between the two leaves a part no record names (the next attempt
// deletes it) and its lines are done again.
type partWriter struct {
	s     *Service
	o     *owner
	job   *Job
	every int64
	seq   int

	up      storage.Upload
	key     string
	buf     *bufio.Writer
	started time.Time

	// since the last checkpoint
	lines, completed, failed          int64
	prompt, completion, total         int64
	cached, reasoning                 int64
	modelTokens                       int64
	modelCost                         money.Nanos
	end                               int64
	estimated                         bool
	llmModel, llmUpstream, firstError string
	offlineEngine                     string
}

func (w *partWriter) add(ctx context.Context, c *chunk) error {
	if w.up == nil {
		w.key = partObject(w.job.Account, w.job.ID, w.job.Run, w.job.Attempt, w.seq)
		up, err := w.s.store.Create(ctx, w.key)
		if err != nil {
			return fmt.Errorf("writing results part %s: %w", w.key, err)
		}
		w.up, w.started = up, time.Now()
		if w.buf == nil {
			w.buf = bufio.NewWriterSize(up, writeBuffer)
		} else {
			w.buf.Reset(up)
		}
	}
	if _, err := w.buf.Write(c.out.Bytes()); err != nil {
		return fmt.Errorf("writing results part %s: %w", w.key, err)
	}
	w.lines += int64(len(c.lines))
	w.completed += c.completed
	w.failed += c.failed
	w.prompt += c.prompt
	w.completion += c.completion
	w.cached += c.cached
	w.reasoning += c.reasoning
	w.total += c.total
	w.modelTokens += c.modelTokens
	w.modelCost += c.modelCost
	w.estimated = w.estimated || c.estimated
	w.end = c.end
	if w.llmModel == "" {
		w.llmModel, w.llmUpstream = c.llmModel, c.llmUpstream
	}
	if w.offlineEngine == "" {
		w.offlineEngine = c.offlineEngine
	}
	if w.firstError == "" {
		w.firstError = c.firstError
	}
	if w.lines >= w.every || time.Since(w.started) >= w.s.t.checkpointAge {
		return w.checkpoint(ctx)
	}
	return nil
}

// checkpoint commits the current part, if any, and records it.
func (w *partWriter) checkpoint(ctx context.Context) error {
	if w.up == nil {
		return nil
	}
	if err := w.buf.Flush(); err != nil {
		return fmt.Errorf("writing results part %s: %w", w.key, err)
	}
	if err := w.up.Commit(); err != nil {
		w.up = nil
		return fmt.Errorf("saving results part %s: %w", w.key, err)
	}
	w.up = nil
	if w.s.at("part-committed") {
		return errDied
	}
	err := w.o.update(ctx, func(j *Job) {
		p := &j.Progress
		p.addPart(j.Run, j.Attempt, w.seq)
		p.Offset, p.Lines = w.end, p.Lines+w.lines
		p.PromptTokens += w.prompt
		p.CompletionTokens += w.completion
		p.CachedTokens += w.cached
		p.ReasoningTokens += w.reasoning
		p.TotalTokens += w.total
		p.ModelTokens += w.modelTokens
		p.ModelCostNanos += int64(w.modelCost)
		p.Estimated = p.Estimated || w.estimated
		if p.LLMModel == "" {
			p.LLMModel, p.LLMUpstream = w.llmModel, w.llmUpstream
		}
		if p.OfflineEngine == "" {
			p.OfflineEngine = w.offlineEngine
		}
		if p.FirstError == "" {
			p.FirstError = w.firstError
		}
		j.RequestsCompleted += w.completed
		j.RequestsFailed += w.failed
		now := time.Now().UTC()
		j.HeartbeatAt = &now
	})
	if err != nil {
		if errors.Is(err, errLost) {
			_ = w.s.store.Delete(context.Background(), w.key) // named by no record
		}
		return err
	}
	w.seq++
	w.lines, w.completed, w.failed, w.prompt, w.completion, w.total = 0, 0, 0, 0, 0, 0
	w.cached, w.reasoning = 0, 0
	w.modelTokens, w.modelCost = 0, 0
	w.estimated = false
	w.llmModel, w.llmUpstream, w.firstError, w.offlineEngine = "", "", "", ""
	if w.s.at("checkpointed") {
		return errDied
	}
	return nil
}

func (w *partWriter) abort() {
	if w.up != nil {
		w.up.Abort()
		w.up = nil
	}
}

// finish joins the parts into the results file, bills the job and
// records it completed — or failed, when no line could be classified.
func (s *Service) finish(ctx context.Context, o *owner) error {
	j := o.snapshot()
	// Checked again at the end, not only when a run starts: an input
	// replaced while a run read it (the upload form works until it
	// expires) left results that no longer matched the stored input.
	if _, ended, err := s.checkInput(ctx, o, j, true); ended || err != nil {
		return err
	}
	if j.RequestsCompleted == 0 {
		lines := fmt.Sprintf("%d lines", j.Progress.Lines)
		if j.Progress.Lines == 1 {
			lines = "1 line"
		}
		msg := fmt.Sprintf("no line of the input could be classified (%s)", lines)
		if j.Progress.FirstError != "" {
			msg += "; " + j.Progress.FirstError
		}
		return o.fail(ctx, msg)
	}
	outKey := resultObject(j.Account, j.ID, j.Run, j.Attempt)
	if err := s.join(ctx, outKey, j.partKeys(j.Progress.Parts)); err != nil {
		return err
	}
	if s.at("joined") {
		return errDied
	}
	// The bill's time is saved before the bill, and a job billed again
	// keeps it: ClickHouse keys usage_events by account, UTC day and id,
	// so a bill repeated with a new time on another day was a second row
	// under FINAL, and the job counted twice on the invoice.
	repeat := j.BilledAt != nil // a run before this one billed the job
	if !repeat {
		now := time.Now().UTC()
		if err := o.update(ctx, func(j *Job) { j.BilledAt = &now }); err != nil {
			return err
		}
		j = o.snapshot()
	}
	var debitedBefore *int64
	if d, ok := s.runtime.Debited(j.Account); ok {
		debitedBefore = new(int64(d))
	}
	// Billed before the completion is recorded: a worker dying in between
	// leaves the job processing, and its successor bills again with the
	// same event id and time, which ClickHouse keeps once and the debit
	// recognizes. The other order could lose the bill. So the bill is
	// safe from a crash first, as a chat answer's is before its last
	// byte: under billing.durability fsync a power loss right after the
	// completion, recorded in JetStream, could take the bill with it.
	ev := s.billingEvent(j, j.ID, *j.BilledAt, j.unbilled())
	cost := ev.CostNanos // the recorder owns ev once it has it
	if !meter.RecordAndWait(s.recorder, ev) {
		s.logf("batch: job %s: its bill is not on disk after %s; completing it anyway", j.ID, meter.DurableWait)
	}
	if !repeat {
		// Chat calls and other jobs are admitted on the balance less what
		// this process billed and the debits do not show yet; a job's bill
		// was missing from it, so while billing was down an account spent
		// again what a finished job had. Once per job: a bill repeated
		// (BilledAt, saved before any bill, says there was one) is debited
		// once, and noted again it held the account's balance short until
		// the process restarted.
		s.runtime.NoteCharge(j.Account, cost)
	}
	now := time.Now().UTC()
	if s.at("billed") {
		return errDied
	}
	err := o.update(ctx, func(j *Job) {
		actual := j.Progress.TotalTokens
		j.Status, j.CompletedAt, j.ActualTokens, j.OutputKey = StatusCompleted, &now, &actual, outKey
		j.Billed, j.Error, j.HeartbeatAt, j.Resumable = true, "", nil, false
		j.DebitedBeforeBill, j.BilledBy = debitedBefore, s.name
	})
	if err != nil {
		return err
	}
	s.release(ctx, j.Account, j.ID)
	// The parts stay named in the record, so a delete that fails here is
	// tried again when the job is deleted.
	for _, key := range j.partKeys(j.Progress.Parts) {
		if err := s.store.Delete(ctx, key); err != nil {
			s.logf("batch: job %s: deleting %s: %v", j.ID, key, err)
		}
	}
	return nil
}

// join streams parts, in order, into one object.
func (s *Service) join(ctx context.Context, key string, parts []string) error {
	up, err := s.store.Create(ctx, key)
	if err != nil {
		return fmt.Errorf("writing results %s: %w", key, err)
	}
	defer up.Abort()
	buf := make([]byte, writeBuffer)
	for _, part := range parts {
		rc, err := s.store.Open(ctx, part)
		if err != nil {
			return fmt.Errorf("reading results part %s: %w", part, err)
		}
		_, err = io.CopyBuffer(up, rc, buf)
		rc.Close()
		if err != nil {
			return fmt.Errorf("joining results part %s: %w", part, err)
		}
	}
	if err := up.Commit(); err != nil {
		return fmt.Errorf("saving results %s: %w", key, err)
	}
	return nil
}

// checkInput describes the job's input, failing the job when the input
// is gone or, with counted, is not the one it counted (inputChanged).
// ended says the job was failed; err is then what failing it returned.
//
// A job whose input changed is billed for the lines it did since its
// last bill, as a stop bills them: they ran on the model, and failed
// unbilled, a tenant could have any number of lines classified at the
// operator's cost by uploading again with the job's form before the end.
// An input gone is not billed: the job's owner cannot delete it while
// the job runs (DELETE is refused), only the object store can lose it.
func (s *Service) checkInput(ctx context.Context, o *owner, j *Job, counted bool) (input storage.Info, ended bool, err error) {
	input, err = s.store.Stat(ctx, j.InputKey)
	switch {
	case errors.Is(err, storage.ErrNotExist):
		return input, true, o.fail(ctx, "the input file is gone: upload it again and start the job")
	case err != nil:
		return input, false, fmt.Errorf("reading the input size: %w", err)
	}
	if msg := inputChanged(j, input); counted && msg != "" {
		if due := o.snapshot().unbilled(); !due.zero() {
			msg += fmt.Sprintf("; the %d tokens of the lines it had classified are billed: they ran on the model", due.TotalTokens)
		}
		return input, true, s.failBilled(ctx, o, msg)
	}
	return input, false, nil
}

// inputChanged says why a job's input is not the one it counted, or "".
// The size alone missed a replacement of the same size, and a resumed run
// read the rest of its lines from the other file. (Jobs counted before
// the version was kept have none to compare.)
func inputChanged(j *Job, now storage.Info) string {
	if now.Size != j.Progress.InputSize {
		return fmt.Sprintf("the input file changed since the job counted its lines (%d bytes, %d before): start the job again to run the new one from line 1", now.Size, j.Progress.InputSize)
	}
	if j.Progress.InputVersion != "" && now.Version != j.Progress.InputVersion {
		return "the input file was uploaded again since the job counted its lines: start the job again to run the new one from line 1"
	}
	return ""
}

// recentBillWindow is how long after it is made a job's bill (its
// completion's or a stop's) may not be in the account's balance yet: the
// consumer's batch, the KV watch, a consumer restart.
const recentBillWindow = 2 * time.Minute

// recentlyBilled is what the account's bills of the last
// recentBillWindow that another process made, and whose debit has not
// landed, charged: the completion bills of its other jobs, and the stop
// bills of all its jobs, j's too (j's completion bill is never asked
// about: cannotPay does not ask once j billed). A bill counts in the
// balance of the process that made it (NoteCharge), and in no other until
// debited. A job started right after another completed read a balance
// without that job's debit: five jobs in a row on one account each passed
// the check and took it to -2 USD. Stop bills were left to NoteCharge, and
// a gateway admitted a job, or let one go on, on a balance without the
// stop's bill another gateway had just made (of another job, or of j,
// stopped there and resumed here).
func (s *Service) recentlyBilled(ctx context.Context, j *Job) money.Nanos {
	jobs, err := s.List(ctx, j.Account)
	if err != nil {
		return 0
	}
	debited, known := s.runtime.Debited(j.Account)
	// notInBalance says whether a bill of cost made by another process,
	// when the debits stood at before, is not in the balance yet. The
	// debits have grown by its cost since: it is, and counting it again
	// refused jobs the account could pay for. (Other calls' debits could
	// make up that growth while the bill waits; the check then lets
	// through at most that bill's cost more.)
	notInBalance := func(by string, at time.Time, before *int64, cost money.Nanos) bool {
		if by == s.name || time.Since(at) > recentBillWindow {
			return false // in this process's balance until debited (NoteCharge), or past the window
		}
		return !known || before == nil || debited-money.Nanos(*before) < cost
	}
	var sum money.Nanos
	for _, other := range jobs {
		for _, b := range other.StopBills {
			if cost := money.Nanos(b.CostNanos); notInBalance(b.BilledBy, b.At, b.DebitedBeforeBill, cost) {
				sum += cost
			}
		}
		if other.ID == j.ID || other.Status != StatusCompleted || other.ActualTokens == nil || other.CompletedAt == nil {
			continue
		}
		cost := money.Nanos(other.unbilled().CostNanos) // its completion's bill
		if notInBalance(other.BilledBy, *other.CompletedAt, other.DebitedBeforeBill, cost) {
			sum += cost
		}
	}
	return sum
}

// jobCost is what tokens cost at a job's price (its recorded
// batch.price_per_token); 0 with the error for a price that does not parse.
func jobCost(price string, tokens int64) (money.Nanos, error) {
	p, err := money.ParsePrice(price)
	if err != nil {
		return 0, err
	}
	var cost money.Atto
	cost.Add(tokens, p)
	return cost.Nanos(), nil
}

// cost is what the job's lines done so far cost, as /v1/classify bills
// each line alone at the job's price: the tokens a catalog model spent
// at least at the model's own prices (Progress.ModelCostNanos, summed
// line by line), the rest at the job's price. The error is the job
// price's, whose tokens then cost 0.
func (j *Job) cost() (money.Nanos, error) {
	p := &j.Progress
	cost, err := jobCost(j.Price, p.TotalTokens-p.ModelTokens)
	return cost + money.Nanos(p.ModelCostNanos), err
}

// billedByStops is what the job's stop bills of its current input (as
// counted) charged together.
func (j *Job) billedByStops() Charge {
	var sum Charge
	for _, b := range j.StopBills {
		if b.forInput(&j.Progress) {
			sum = sum.plus(b.Charge)
		}
	}
	return sum
}

// unbilled is what the lines done so far cost beyond what the job's stop
// bills of this input charged. A run started over from the first line
// (after a failure) does again lines a stop billed: they are not billed
// again, and a count smaller the second time (an llm's answers vary)
// bills nothing below 0.
func (j *Job) unbilled() Charge {
	cost, _ := j.cost() // an unparsable price bills its tokens at 0, and billingEvent says so
	p, billed := &j.Progress, j.billedByStops()
	c := Charge{
		PromptTokens:     max(p.PromptTokens-billed.PromptTokens, 0),
		CompletionTokens: max(p.CompletionTokens-billed.CompletionTokens, 0),
		TotalTokens:      max(p.TotalTokens-billed.TotalTokens, 0),
		CostNanos:        max(int64(cost)-billed.CostNanos, 0),
	}
	c.CachedTokens = min(max(p.CachedTokens-billed.CachedTokens, 0), c.PromptTokens)
	c.ReasoningTokens = min(max(p.ReasoningTokens-billed.ReasoningTokens, 0), c.CompletionTokens)
	return c
}

// billingEvent is a usage event of the job: id is the job id for its
// completion's bill, and a stop's bill's id for that bill (StopBill), and
// at the time saved with it, so billing it twice is billing it once.
func (s *Service) billingEvent(j *Job, id string, at time.Time, c Charge) *meter.Event {
	if _, err := j.cost(); err != nil {
		s.logf("batch: job %s has price %q: %v; billing its tokens at 0", j.ID, j.Price, err)
	}
	ev := &meter.Event{
		ID: id, JobID: j.ID, Time: at, Account: j.Account, KeyID: j.KeyID, Endpoint: "/v1/batch",
		Model:        cmp.Or(j.Progress.OfflineEngine, classifiers.EngineLexical),
		PromptTokens: c.PromptTokens, CachedTokens: c.CachedTokens,
		CompletionTokens: c.CompletionTokens, ReasoningTokens: c.ReasoningTokens,
		CostNanos: money.Nanos(c.CostNanos), UsageSource: meter.SourceTokenizer, Status: 200,
	}
	if j.StartedAt != nil {
		ev.Latency = at.Sub(*j.StartedAt)
	}
	// As a /v1/classify event does, the event names the model whenever
	// it spent tokens, lines an offline engine answered after it failed
	// too, and the upstream that answered: it said lexical, with no
	// upstream and usage from the tokenizer, for a job whose model
	// failed every line, and never named a pool's member.
	if m := j.Progress.LLMModel; m != "" {
		ev.Model, ev.Upstream, ev.UsageSource = m, j.Progress.LLMUpstream, meter.SourceUpstream
		if j.Progress.Estimated {
			ev.UsageSource = meter.SourceEstimated
		}
		if ev.Upstream == "" {
			// Checkpointed by an earlier release, which kept no upstream:
			// the model's own, when it has one.
			for _, cm := range s.runtime.Config().Models {
				if cm.ID == m {
					ev.Upstream = cm.Upstream
				}
			}
		}
	}
	return ev
}

// lineClassifier turns input lines into result lines.
type lineClassifier struct {
	s       *Service
	engine  Engine
	req     *Request
	maxText int
	maxLine int
	// price is the job's, per token; 0 when it does not parse (the bill
	// says so).
	price money.Price
	// labelJSON is each label as a JSON string, encoded once per run.
	labelJSON map[string][]byte
	outage    *outage // the engine's, shared by the run's lines
}

func newLineClassifier(s *Service, engine Engine, j *Job, cfg *config.Config) *lineClassifier {
	price, _ := money.ParsePrice(j.Price)
	lc := &lineClassifier{s: s, engine: engine, req: &j.Request, maxText: int(cfg.Plugins.MaxTextBytes), maxLine: maxLineBytes(cfg),
		price: price, labelJSON: make(map[string][]byte, len(j.Request.Labels)), outage: newOutage(s.t.retryBackoff, s.t.retries)}
	for _, l := range j.Request.Labels {
		lc.labelJSON[l] = jsonString(l)
	}
	return lc
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always encodes
	return b
}

// classifyChunk fills c's results. An engine that stays unavailable, or a
// stopped run, leaves c.err set and the rest of the chunk undone.
func (lc *lineClassifier) classifyChunk(ctx context.Context, c *chunk) {
	for i, line := range c.lines {
		n := c.first + int64(i)
		if c.tooLong[i] {
			lc.lineError(c, n, fmt.Sprintf("the line is longer than %d bytes (4 times plugins.max_text_bytes, plus 1KiB)", lc.maxLine), nil)
			continue
		}
		text, problem := parseLine(line, lc.maxText)
		if problem != "" {
			lc.lineError(c, n, problem, nil)
			continue
		}
		res, err := lc.classify(ctx, lc.req.classify(text))
		if err != nil {
			if errors.Is(err, ErrEngineUnavailable) || ctx.Err() != nil {
				c.err = err
				return
			}
			// An llm that answered something else than asked, twice, was
			// paid for upstream: the line bills its tokens.
			lc.lineError(c, n, quote(err.Error()), &res)
			continue
		}
		lc.lineResult(c, n, &res)
	}
}

// quote shortens an engine's words for a result line.
func quote(msg string) string { return utf8cut.Shorten(msg, errorMaxText) }

// classify asks the engine, retrying while it is unavailable: the job's
// lines pause together, and one at a time asks again (see outage).
func (lc *lineClassifier) classify(ctx context.Context, req classifiers.ClassifyRequest) (Answer, error) {
	for {
		trial, err := lc.outage.admit(ctx)
		if err != nil {
			return Answer{}, err
		}
		res, err := lc.engine.Classify(ctx, req)
		switch {
		case ctx.Err() != nil:
			lc.outage.release(trial)
			return res, err
		case err == nil || !errors.Is(err, ErrEngineUnavailable):
			lc.outage.answered(trial)
			return res, err
		}
		if err := lc.outage.failed(trial, err); err != nil {
			return res, err
		}
	}
}

// textOf finds a line's text, the key in any case, as /v1/classify found
// it until it began refusing "Text": a job's input files are kept as they
// were written, and lines that classified before must not start failing.
// twice says a second one came (refused: which of two texts a client
// meant cannot be known).
func textOf(v gjson.Result) (t gjson.Result, twice bool) {
	v.ForEach(func(key, value gjson.Result) bool {
		if strings.EqualFold(key.Str, "text") {
			twice = t.Exists()
			t = value
		}
		return !twice
	})
	return t, twice
}

// parseLine returns the line's text, or why the line has none.
func parseLine(line []byte, maxText int) (string, string) {
	const want = `: want a JSON object with a text string, such as {"text": "I was charged twice"}`
	if len(bytes.TrimSpace(line)) == 0 {
		return "", "the line is empty" + want
	}
	if jsoncheck.TooDeep(line, jsoncheck.MaxDepth) {
		return "", fmt.Sprintf("the line nests arrays and objects more than %d deep", jsoncheck.MaxDepth) + want
	}
	if !gjson.ValidBytes(line) {
		return "", "the line is not valid JSON" + want
	}
	v := gjson.ParseBytes(line)
	if !v.IsObject() {
		return "", "the line is not a JSON object" + want
	}
	t, twice := textOf(v)
	switch {
	case twice:
		return "", "the line has two text fields" + want
	case !t.Exists():
		return "", "the line has no text field" + want
	case t.Type != gjson.String:
		return "", "text is not a string" + want
	case t.Str == "":
		return "", "text is empty"
	case config.Blank(t.Str):
		return "", "text holds only whitespace or invisible characters"
	case len(t.Str) > maxText:
		return "", fmt.Sprintf("text is %d bytes, longer than plugins.max_text_bytes (%d bytes)", len(t.Str), maxText)
	}
	return t.Str, ""
}

// Result lines. Mode single: {"line":N,"label":…,"confidence":…,"tokens":…,"engine":…},
// with "tie":true after confidence when the engine could not separate the
// top labels (classifiers.ClassifyResult.Tie);
// mode multi: {"line":N,"labels":[{"label":…,"confidence":…}],"tokens":…,"engine":…}
// ("model" follows engine for the llm, "fallback" for an offline engine
// that answered after the llm failed, and "no_logprobs":true when the
// llm's upstream sent none)
// (labels at or above the threshold, highest first); a line that failed:
// {"line":N,"error":"…"}. N is the input line, from 1.

func (lc *lineClassifier) lineResult(c *chunk, n int64, res *Answer) {
	total := lc.count(c, res)
	b := c.out.AvailableBuffer()
	b = append(b, `{"line":`...)
	b = strconv.AppendInt(b, n, 10)
	if lc.req.Mode == classifiers.ModeMulti {
		b = append(b, `,"labels":[`...)
		for i, l := range res.Labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"label":`...)
			b = lc.appendLabel(b, l.Label)
			b = append(b, `,"confidence":`...)
			b = strconv.AppendFloat(b, l.Confidence, 'f', -1, 64)
			b = append(b, '}')
		}
		b = append(b, ']')
	} else {
		b = append(b, `,"label":`...)
		b = lc.appendLabel(b, res.Label)
		b = append(b, `,"confidence":`...)
		b = strconv.AppendFloat(b, res.Confidence, 'f', -1, 64)
		if res.Tie {
			b = append(b, `,"tie":true`...)
		}
	}
	b = append(b, `,"tokens":`...)
	b = strconv.AppendInt(b, total, 10)
	b = appendEngine(b, res)
	b = append(b, "}\n"...)
	c.out.Write(b)
	c.completed++
	if res.Engine != classifiers.EngineLLM && c.offlineEngine == "" {
		c.offlineEngine = res.Engine
	}
}

// count adds a line's usage to the chunk's and returns its total tokens
// (prompt and completion when the engine gave no total). The tokens a
// model spent cost what /v1/classify makes them cost alone: at least
// the model's prices, else the job's (the rest of the line's tokens are
// billed at the job's price with the job).
func (lc *lineClassifier) count(c *chunk, res *Answer) int64 {
	u := res.Usage
	total := u.Tokens()
	c.prompt += u.PromptTokens
	c.completion += u.CompletionTokens
	c.cached += u.CachedTokens
	c.reasoning += u.ReasoningTokens
	c.total += total
	c.estimated = c.estimated || u.Estimated
	spent := &res.Spent
	if tokens := spent.Usage.Tokens(); tokens > 0 {
		var atJobPrice money.Atto
		atJobPrice.Add(tokens, lc.price)
		c.modelTokens += tokens
		c.modelCost += max(atJobPrice.Nanos(), spent.Cost)
		if c.llmModel == "" {
			c.llmModel, c.llmUpstream = spent.Model, spent.Upstream
		}
	}
	return total
}

// appendEngine names who answered the line, as /v1/classify does: with
// plugins.engine auto, lines of one job can go to the llm or to the
// offline engine, which then says why (fallback).
func appendEngine(b []byte, res *Answer) []byte {
	b = append(b, `,"engine":`...)
	b = append(b, jsonString(res.Engine)...)
	if res.Answer.Model != "" {
		b = append(b, `,"model":`...)
		b = append(b, jsonString(res.Answer.Model)...)
	}
	if res.Fallback != "" {
		b = append(b, `,"fallback":`...)
		b = append(b, jsonString(res.Fallback)...) // bounded: the engine quotes 200 bytes of an answer
	}
	if res.NoLogprobs {
		b = append(b, `,"no_logprobs":true`...)
	}
	return b
}

func (lc *lineClassifier) appendLabel(b []byte, label string) []byte {
	if q, ok := lc.labelJSON[label]; ok {
		return append(b, q...)
	}
	return append(b, jsonString(label)...)
}

// lineError writes a failed line; res, when the engine was asked, is
// what it cost upstream, if anything, written as its "tokens" and
// counted in the job's.
func (lc *lineClassifier) lineError(c *chunk, n int64, msg string, res *Answer) {
	b := c.out.AvailableBuffer()
	b = append(b, `{"line":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"error":`...)
	b = append(b, jsonString(msg)...)
	if res == nil {
		res = &Answer{}
	}
	if total := lc.count(c, res); total > 0 {
		b = append(b, `,"tokens":`...)
		b = strconv.AppendInt(b, total, 10)
	}
	b = append(b, "}\n"...)
	c.out.Write(b)
	c.failed++
	if c.firstError == "" {
		c.firstError = fmt.Sprintf("line %d: %s", n, msg)
	}
}

// lineReader reads lines of at most max bytes. Lines end at '\n' (a '\r'
// before it is dropped); a last line without one counts.
type lineReader struct {
	r      *bufio.Reader
	max    int
	offset int64 // input bytes consumed
	long   []byte
}

func newLineReader(r io.Reader, offset int64, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, readBuffer), max: max, offset: offset}
}

// next returns the next line, valid until the following call, without a
// byte order mark at the start of the input. tooLong says the line had
// more than max bytes; they were skipped, and line is empty. The error is
// io.EOF at the end of the input.
func (lr *lineReader) next() (line []byte, tooLong bool, err error) {
	if lr.offset == 0 {
		// The first line would otherwise be "not valid JSON" although it
		// looks valid in any editor. Skipped before the line is read, so
		// it is not counted against max: a first line of exactly max
		// bytes after one was refused.
		if head, _ := lr.r.Peek(len(jsoncheck.UTF8BOM)); bytes.Equal(head, jsoncheck.UTF8BOM) {
			n, _ := lr.r.Discard(len(jsoncheck.UTF8BOM))
			lr.offset += int64(n)
		}
	}
	return lr.nextLine()
}

func (lr *lineReader) nextLine() (line []byte, tooLong bool, err error) {
	lr.long = lr.long[:0]
	for {
		frag, err := lr.r.ReadSlice('\n')
		lr.offset += int64(len(frag))
		if err == nil && len(lr.long) == 0 && !tooLong {
			return lr.limit(trimEOL(frag)) // the common case: no copy
		}
		if !tooLong {
			// Room for a CRLF beyond max: the limit is the line's alone.
			if len(lr.long)+len(frag) > lr.max+2 {
				tooLong, lr.long = true, lr.long[:0]
			} else {
				lr.long = append(lr.long, frag...)
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF:
			if len(lr.long) == 0 && !tooLong {
				return nil, false, io.EOF
			}
		case err != nil:
			return nil, false, err
		}
		if tooLong {
			return nil, true, nil
		}
		return lr.limit(trimEOL(lr.long))
	}
}

// limit returns line, or says it is too long: over max bytes without its
// line ending. Counted with it, a line of max+1 bytes passed when it
// ended in LF alone, and not in CRLF.
func (lr *lineReader) limit(line []byte) ([]byte, bool, error) {
	if len(line) > lr.max {
		return nil, true, nil
	}
	return line, false, nil
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}
