package accounts

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/money"
)

// SeqCost is one usage event's cost and its sequence number in the USAGE
// stream, which is what ApplyUsage recognizes it by.
type SeqCost struct {
	Seq  uint64
	Cost money.Nanos
	// Job is the id of the batch job's event this is, "" for others: a
	// job's event is charged once whatever the message that brings it.
	// A job has one event per stop that billed, and one at completion.
	Job string
}

// SeqRange is the stream sequences From through Through, both included.
type SeqRange struct {
	From    uint64 `json:"from"`
	Through uint64 `json:"through"`
}

// Usage is what one billing batch charges to one account.
type Usage struct {
	// Events are the account's events in the batch.
	Events []SeqCost
	// Covered are ranges of sequences the batch holds every message of, so
	// every event of the account in them is in Events. Optional: it lets
	// the account remember a whole batch as one range rather than one
	// range per event.
	Covered []SeqRange
	// SettledThrough is a sequence up to which every message has been
	// acknowledged, so none of them is ever delivered again: the billing
	// consumer's ack floor. 0 when unknown.
	SettledThrough uint64
}

// ApplyUsage charges the account for the events of usage it has not been
// charged for yet and marks them charged, both in one compare-and-set. So
// the same events applied again (a batch redelivered because its ack was
// lost after the debit) charge nothing, and batches may arrive in any
// order, from several billing processes at once. It returns the account
// after the change and the amount charged by this call.
//
// The account remembers charged events as BilledThroughSeq (every message
// up to it is charged or will never be delivered again) plus ranges above
// it. Covered and SettledThrough let those ranges fold into
// BilledThroughSeq; without them the record grows with every batch.
//
// A batch job's event (SeqCost.Job) is charged once whatever message
// brings it: the account remembers the jobs charged in the last 30 days
// (the last 256), since the event of a worker that died after billing a
// job is published again, in another message, when its process restarts,
// after the worker that took the job over billed it too.
//
// Sequences must come from one stream. Recreating the USAGE stream starts
// them at 1 again and ApplyUsage would take new events for charged ones:
// reset billed_through_seq on every account before billing a new stream.
func (s *Service) ApplyUsage(ctx context.Context, id string, usage Usage) (Account, money.Nanos, error) {
	events, covered, err := normalizeUsage(usage)
	if err != nil {
		return Account{}, 0, fmt.Errorf("applying usage to %s: %w", id, err)
	}
	for {
		rec, rev, err := s.getAccount(ctx, id)
		if err != nil {
			return Account{}, 0, err
		}
		charge, changed, err := rec.applyUsage(events, covered, usage.SettledThrough, time.Now())
		if err != nil {
			return Account{}, 0, fmt.Errorf("applying usage to %s: %w", id, err)
		}
		if !changed {
			return rec.account(), 0, nil
		}
		data, err := json.Marshal(&rec)
		if err != nil {
			return Account{}, 0, fmt.Errorf("encoding account %s: %w", id, err)
		}
		newRev, err := s.accounts.Update(ctx, id, data, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // lost the race; the loop re-reads
		}
		if err != nil {
			return Account{}, 0, fmt.Errorf("updating account %s: %w", id, err)
		}
		s.snap.putAccount(id, newRev, rec, false)
		return rec.account(), charge, nil
	}
}

// normalizeUsage checks usage and returns its events sorted by sequence,
// each once, and the covered ranges, each event's own sequence included,
// sorted and merged.
func normalizeUsage(usage Usage) ([]SeqCost, []SeqRange, error) {
	events := slices.Clone(usage.Events)
	slices.SortFunc(events, func(a, b SeqCost) int { return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Job, b.Job)) })
	covered := slices.Clone(usage.Covered)
	unique := events[:0]
	for i, ev := range events {
		if ev.Seq == 0 {
			return nil, nil, fmt.Errorf("%w: stream sequences start at 1, got an event at 0", ErrInvalidInput)
		}
		if ev.Cost < 0 {
			return nil, nil, fmt.Errorf("%w: event %d costs %s USD, costs must not be negative", ErrInvalidInput, ev.Seq, ev.Cost)
		}
		if i > 0 && ev.Seq == events[i-1].Seq && ev.Job == events[i-1].Job {
			if ev.Cost != events[i-1].Cost {
				return nil, nil, fmt.Errorf("%w: event %d is listed with two costs", ErrInvalidInput, ev.Seq)
			}
			continue
		}
		unique = append(unique, ev)
		covered = append(covered, SeqRange{From: ev.Seq, Through: ev.Seq})
	}
	for _, r := range usage.Covered {
		if r.From == 0 || r.From > r.Through {
			return nil, nil, fmt.Errorf("%w: covered range %d-%d", ErrInvalidInput, r.From, r.Through)
		}
	}
	return unique, mergeRanges(covered), nil
}

// applyUsage charges the events not yet billed and records them and
// covered (both normalized) as billed. changed is false when the record is
// left as it was.
func (r *accountRecord) applyUsage(events []SeqCost, covered []SeqRange, settledThrough uint64, now time.Time) (charge money.Nanos, changed bool, err error) {
	var total int64
	jobsBefore := len(r.BilledJobs)
	for _, ev := range events {
		if r.billed(ev.Seq) {
			continue
		}
		if ev.Job != "" {
			if r.billedJob(ev.Job) {
				continue // brought again by another message
			}
			r.BilledJobs = append(r.BilledJobs, billedJob{ID: ev.Job, At: now})
		}
		var ok bool
		if total, ok = addNanos(total, int64(ev.Cost)); !ok {
			return 0, false, fmt.Errorf("%w: the batch's charge overflows", ErrInvalidInput)
		}
	}
	floor := max(r.BilledThroughSeq, settledThrough)
	ranges := foldRanges(floor, mergeRanges(append(slices.Clone(r.BilledRanges), covered...)))
	if len(ranges) > 0 && ranges[0].From <= floor+1 {
		floor = max(floor, ranges[0].Through)
		ranges = ranges[1:]
	}
	if len(ranges) == 0 {
		ranges = nil
	}
	if total == 0 && floor == r.BilledThroughSeq && slices.Equal(ranges, r.BilledRanges) && len(r.BilledJobs) == jobsBefore {
		return 0, false, nil
	}
	r.pruneBilledJobs(now)
	balance, ok1 := addNanos(r.BalanceNanos, -total)
	debited, ok2 := addNanos(r.DebitedNanos, total)
	if !ok1 || !ok2 {
		return 0, false, fmt.Errorf("%w: debiting %s USD would overflow the balance", ErrInvalidInput, money.Nanos(total))
	}
	r.BalanceNanos, r.DebitedNanos = balance, debited
	r.BilledThroughSeq, r.BilledRanges = floor, ranges
	return money.Nanos(total), true, nil
}

// billedJob reports whether batch job id was charged already.
func (r *accountRecord) billedJob(id string) bool {
	return slices.ContainsFunc(r.BilledJobs, func(j billedJob) bool { return j.ID == id })
}

// pruneBilledJobs forgets the jobs charged before billedJobWindow and the
// oldest past maxBilledJobs.
func (r *accountRecord) pruneBilledJobs(now time.Time) {
	r.BilledJobs = slices.DeleteFunc(r.BilledJobs, func(j billedJob) bool { return now.Sub(j.At) > billedJobWindow })
	if n := len(r.BilledJobs) - maxBilledJobs; n > 0 {
		r.BilledJobs = r.BilledJobs[n:]
	}
	if len(r.BilledJobs) == 0 {
		r.BilledJobs = nil
	}
}

// billed reports whether the event at seq has been charged or will never
// be delivered again.
func (r *accountRecord) billed(seq uint64) bool {
	if seq <= r.BilledThroughSeq {
		return true
	}
	i, found := slices.BinarySearchFunc(r.BilledRanges, seq, func(rg SeqRange, seq uint64) int {
		return cmp.Compare(rg.From, seq)
	})
	if found {
		return true
	}
	return i > 0 && seq <= r.BilledRanges[i-1].Through
}

// mergeRanges sorts ranges and merges those that overlap or touch.
func mergeRanges(ranges []SeqRange) []SeqRange {
	slices.SortFunc(ranges, func(a, b SeqRange) int { return cmp.Compare(a.From, b.From) })
	merged := ranges[:0]
	for _, rg := range ranges {
		if n := len(merged); n > 0 && rg.From <= merged[n-1].Through+1 {
			merged[n-1].Through = max(merged[n-1].Through, rg.Through)
			continue
		}
		merged = append(merged, rg)
	}
	return merged
}

// foldRanges drops the merged ranges that floor already holds and cuts
// the one it reaches into.
func foldRanges(floor uint64, merged []SeqRange) []SeqRange {
	out := merged[:0]
	for _, rg := range merged {
		if rg.Through <= floor {
			continue
		}
		rg.From = max(rg.From, floor+1)
		out = append(out, rg)
	}
	return out
}
