package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
)

// GET /v1/batch lists an account's newest jobs from an index of their ids,
// one KV entry per account in NewestBucket, so that a listing reads
// listLength job records whatever the number of jobs the account keeps.
// Listing by walking every job key of the account took 95-210 ms at 10,000
// jobs and 360-490 ms at 30,000, and the defaults let an account keep
// about 720,000 (1,000 an hour for the 30 days of batch.job_retention).
//
// Job ids are UUIDv7, so their order is the order jobs were created in. A
// job's id enters the index before its record is written and leaves it
// after its record is deleted, each with a compare-and-set. An id whose
// record is missing is skipped when listed, and taken out of the index
// unless it is young enough to be a job whose record is being written
// (tuning.unwrittenFor, from the time in the id): a process died in
// between, or a gateway that does not keep the index (the release
// before, in a mixed fleet) deleted the job. An index that is missing
// (jobs made by a release before this one), or that no longer names
// listLength jobs while older ones exist, is rebuilt from the walk, once.
const (
	// NewestBucket holds, per account, the ids of its newest jobs.
	NewestBucket = "TOLLGATE_BATCH_NEWEST"
	// newestKept is how many ids an index keeps: more than listLength,
	// so that deleting a few of the newest jobs does not send the next
	// listing to the walk.
	newestKept = 2 * listLength
)

// newestIndex is an account's entry in NewestBucket.
type newestIndex struct {
	IDs []string `json:"ids"` // newest first, at most newestKept
	// Older says the account may have jobs older than the last of IDs.
	Older bool `json:"older"`
}

// add puts id in the index, keeping the newest newestKept.
func (x *newestIndex) add(id string) {
	if slices.Contains(x.IDs, id) {
		return
	}
	x.IDs = append(x.IDs, id)
	slices.Sort(x.IDs)
	slices.Reverse(x.IDs)
	if len(x.IDs) > newestKept {
		x.IDs = x.IDs[:newestKept]
		x.Older = true
	}
}

// updateNewest applies change to account's index with a compare-and-set,
// reading it again when another write came first. A missing index is
// created only by rebuild: one made here would name only the new job and
// hide the older ones, so it is made with Older set, which sends the
// next listing to the walk.
func (s *Service) updateNewest(ctx context.Context, account string, change func(*newestIndex) bool) error {
	for {
		x, rev, err := s.newestIDs(ctx, account)
		if err != nil {
			return err
		}
		if rev == 0 {
			x.Older = true
		}
		if !change(&x) {
			return nil
		}
		if moved, err := s.storeNewest(ctx, account, x, rev); !moved {
			return err
		}
	}
}

// storeNewest writes x as account's index over its revision rev (0: there
// is none yet). moved: another write came first, and nothing was written.
func (s *Service) storeNewest(ctx context.Context, account string, x newestIndex, rev uint64) (moved bool, err error) {
	data, _ := json.Marshal(&x)
	key := accountToken(account)
	if rev == 0 {
		_, err = s.newest.Create(ctx, key, data)
	} else {
		_, err = s.newest.Update(ctx, key, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("writing the newest jobs of %s: %w", account, err)
	}
	return false, nil
}

// newestIDs is account's index, and its revision (0 when it is missing).
// With replicas it is read from the stream leader: a direct get, which a
// replica a few milliseconds behind may answer, gave an index without a
// job just created through another gateway (1 listing in 120 on a
// 3-node cluster), and an index naming fewer than 20 jobs is taken as
// whole. The same one round trip; listings and creations are not the hot
// path.
func (s *Service) newestIDs(ctx context.Context, account string) (newestIndex, uint64, error) {
	var x newestIndex
	var entry jetstream.KeyValueEntry
	var err error
	if s.replicated {
		entry, err = broker.LeaderGet(ctx, s.js, s.newest, accountToken(account))
	} else {
		entry, err = s.newest.Get(ctx, accountToken(account))
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return x, 0, nil
	}
	if err != nil {
		return x, 0, fmt.Errorf("reading the newest jobs of %s: %w", account, err)
	}
	if json.Unmarshal(entry.Value(), &x) != nil {
		return newestIndex{Older: true}, entry.Revision(), nil
	}
	return x, entry.Revision(), nil
}

// rebuildNewest walks every job key of account and writes its index: the
// newest newestKept of the walked ids and of the index read at rev (an id
// enters the index before its job record is written, so the walk may
// not see it yet). A write since rev makes it read and walk again.
func (s *Service) rebuildNewest(ctx context.Context, account string, x newestIndex, rev uint64) ([]string, error) {
	for try := 0; ; try++ {
		lister, err := s.jobs.ListKeysFiltered(ctx, accountToken(account)+".*")
		if err != nil {
			return nil, fmt.Errorf("listing jobs: %w", err)
		}
		var ids []string
		for key := range lister.Keys() {
			if _, id, ok := strings.Cut(key, "."); ok {
				ids = append(ids, id)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		walked := len(ids)
		// Only young ids newer than every walked one can be jobs whose
		// record is not written yet; any other id the walk did not see
		// names a job that is gone. Kept for good, the ids of the newest
		// jobs deleted elsewhere hid the older jobs from every listing.
		newestWalked := ""
		if walked > 0 {
			newestWalked = slices.Max(ids)
		}
		for _, id := range x.IDs {
			if id > newestWalked && s.mayBeUnwritten(id) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		slices.Reverse(ids)
		ids = slices.Compact(ids)
		next := newestIndex{IDs: ids[:min(len(ids), newestKept)], Older: walked > newestKept}
		moved, err := s.storeNewest(ctx, account, next, rev)
		if err != nil {
			return nil, err
		}
		if moved && try < 3 {
			if x, rev, err = s.newestIDs(ctx, account); err != nil {
				return nil, err
			}
			continue
		}
		// Moved after three tries: jobs made and deleted all along. List
		// what was walked, and leave the index to the writes that won.
		return ids, nil
	}
}

// mayBeUnwritten says whether id, indexed and without a record, may be a
// job whose record is still being written: its id was made less than
// unwrittenFor ago (Create indexes it first, within milliseconds).
func (s *Service) mayBeUnwritten(id string) bool {
	u, err := uuid.Parse(id)
	if err != nil {
		return false
	}
	sec, nsec := u.Time().UnixTime()
	return time.Since(time.Unix(sec, nsec)) < s.t.unwrittenFor
}

// dropMissing takes out of account's index the ids a listing found
// without a record and too old to be jobs being written.
func (s *Service) dropMissing(ctx context.Context, account string, missing []string) {
	err := s.updateNewest(ctx, account, func(x *newestIndex) bool {
		n := len(x.IDs)
		x.IDs = slices.DeleteFunc(x.IDs, func(id string) bool { return slices.Contains(missing, id) })
		return len(x.IDs) < n
	})
	if err != nil {
		s.logf("batch: jobs %v of %s are gone, but stay in the newest jobs' index: %v", missing, account, err)
	}
}

// removeNewest takes id out of account's index, once its record is gone.
func (s *Service) removeNewest(ctx context.Context, account, id string) {
	err := s.updateNewest(ctx, account, func(x *newestIndex) bool {
		i := slices.Index(x.IDs, id)
		if i < 0 {
			return false
		}
		x.IDs = slices.Delete(x.IDs, i, i+1)
		return true
	})
	if err != nil {
		// Listings skip an id whose record is gone.
		s.logf("batch: job %s of %s is deleted, but stays in the newest jobs' index: %v", id, account, err)
	}
}

// ForgetNewest deletes every account's index of its newest jobs, so that
// the next listing of each account builds it again from its job keys
// (`tollgate batch reindex`), and returns how many it deleted. Jobs
// created through a gateway that does not keep the index (the release
// before this one, beside it or after a rollback) are missing from it,
// and nothing cheap tells a listing of an index that names fewer than
// listLength jobs that the account has others. A create meanwhile finds
// no index and makes one that sends the next listing to the walk.
func ForgetNewest(ctx context.Context, js jetstream.JetStream) (int, error) {
	stream, err := js.Stream(ctx, "KV_"+NewestBucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", NewestBucket, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", NewestBucket, err)
	}
	if err := stream.Purge(ctx); err != nil {
		return 0, fmt.Errorf("deleting the indexes in %s: %w", NewestBucket, err)
	}
	return int(info.State.NumSubjects), nil
}
