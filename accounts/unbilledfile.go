package accounts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/durable"
	"github.com/tollgate/tollgate/money"
)

// UnbilledFile, in a gateway's data_dir, holds the gateway's charges its
// accounts' debits did not show yet, so that it counts them again when it
// starts. Started with none, a gateway restarted while the billing
// consumer or ClickHouse was down let every account it had charged spend
// its whole balance again, those charges still waiting to be debited.
//
// It holds the other processes' charges it counts too, restored as gone
// processes' (peerCharges.gone) until they speak again. With its own
// alone, a gateway restarted while another stayed down had nobody to
// tell it the one down's charges, and one running the embedded NATS,
// which stops with it, nobody to answer its start at all: with ClickHouse
// down, each admitted the others' share again at once (7 calls on a
// credit of 10).
const UnbilledFile = "unbilled.json"

const (
	// keepUnbilledEvery is how often UnbilledFile is rewritten when a
	// charge or another process's message came since: what a SIGKILL
	// loses is the charges of the last 100 ms or so, and a stop none
	// (Close writes it). Rewritten once a second, a gateway killed within
	// half a second of its last calls admitted them again at its restart
	// (11 calls more on a credit of 10, more at each kill). A rewrite is
	// not synced: a process killed leaves what it wrote in the page cache.
	keepUnbilledEvery = 100 * time.Millisecond
	// syncUnbilledEvery is how often, at most, UnbilledFile is synced to
	// the disk, and how often it is rewritten when only the debits moved:
	// what a power loss can lose is the last second's.
	syncUnbilledEvery = time.Second
)

// unbilledKept is UnbilledFile's content.
type unbilledKept struct {
	// Process is the process that wrote it: the next one tells the others
	// it replaces it (unbilledMessage.Replaces).
	Process  string                 `json:"process"`
	Accounts map[string]keptCharges `json:"accounts,omitempty"`
}

// keptCharges is what of one account's charges was not debited when the
// account's debits stood at Debited: this process's (Pending), and the
// count as it held it (an unbilled), which the next one takes as it is,
// so that the debits since count against it as they would have.
type keptCharges struct {
	Pending int64 `json:"pending_nanos"`
	Debited int64 `json:"debited_nanos"`
	// CountedFrom is the debits the count starts from (unbilled.debitedAt);
	// absent in a file of an earlier release, which kept Pending alone.
	CountedFrom *int64              `json:"counted_from_nanos,omitempty"`
	Charged     int64               `json:"charged_nanos,omitempty"` // this process's charges since CountedFrom
	Peers       map[string]keptPeer `json:"peers,omitempty"`         // process id → its charges
}

// keptPeer is a peerCharges.
type keptPeer struct {
	Total   int64 `json:"total_nanos"`
	Counted int64 `json:"counted_nanos"` // of Total, what counts since CountedFrom
	Pending int64 `json:"pending_nanos"`
	// GoneDebited is the account's debits when it was taken for gone;
	// absent for a process heard from, taken for gone from Debited.
	GoneDebited *int64 `json:"gone_debited_nanos,omitempty"`
	Replaced    bool   `json:"replaced,omitempty"`
	Waits       int64  `json:"waits_nanos,omitempty"`
}

// keeper writes UnbilledFile.
type keeper struct {
	path     string      // "" in a process that keeps none (no data_dir)
	changed  atomic.Bool // a charge or a message came since the last write
	mu       sync.Mutex
	written  []byte    // what the file holds
	unsynced bool      // written since it was last synced
	syncedAt time.Time // when it was last synced
}

// restoreUnbilled counts again the charges a process before this one on
// dataDir left not debited, from the debits they counted from, and has
// this process keep its own there. Run before shareUnbilled starts.
func (s *Service) restoreUnbilled(dataDir string) error {
	s.kept.path = filepath.Join(dataDir, UnbilledFile)
	data, err := os.ReadFile(s.kept.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		var kept unbilledKept
		if err = json.Unmarshal(data, &kept); err == nil {
			for account, c := range kept.Accounts {
				u := restoredUnbilled(c)
				if u == nil {
					continue
				}
				s.unbilled.Store(account, u)
				if u.charged > 0 {
					s.share.charged.Store(true) // its heartbeats tell the others
				}
				if len(u.peers) > 0 {
					s.share.goneKept.Store(true) // dropped once their debits land
				}
			}
			s.share.replaces = kept.Process
			s.kept.written = data
			return nil
		}
	}
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		err = pathErr.Err // the path is said once, below
	}
	return fmt.Errorf("reading %s: %w (it holds the charges this gateway made that were not debited when it stopped: deleted, those are counted again only once debited)", s.kept.path, err)
}

// restoredUnbilled is the count c kept, the other processes' charges in
// it taken for gone until they speak again (notePeer); nil if it holds
// none.
func restoredUnbilled(c keptCharges) *unbilled {
	pending := money.Nanos(max(c.Pending, 0))
	if c.CountedFrom == nil { // a file of an earlier release: this process's own alone
		if pending == 0 {
			return nil
		}
		return &unbilled{charged: pending, total: pending, debitedAt: money.Nanos(c.Debited), restored: pending}
	}
	charged := money.Nanos(max(c.Charged, 0))
	// The others take out of the charges of the process that wrote the
	// file what this one restored: what it said it had pending, not its
	// charges since CountedFrom, which the debits may show in part.
	u := &unbilled{charged: charged, total: charged, debitedAt: money.Nanos(*c.CountedFrom), restored: min(pending, charged)}
	for process, kp := range c.Peers {
		if u.peers == nil {
			u.peers = make(map[string]*peerCharges)
		}
		p := &peerCharges{total: money.Nanos(kp.Total), pending: money.Nanos(max(kp.Pending, 0)), gone: true, goneDebited: money.Nanos(c.Debited), replaced: kp.Replaced, waits: money.Nanos(max(kp.Waits, 0))}
		p.base = p.total - money.Nanos(max(kp.Counted, 0))
		if kp.GoneDebited != nil {
			p.goneDebited = money.Nanos(*kp.GoneDebited)
		}
		u.peers[process] = p
	}
	if u.charged == 0 && len(u.peers) == 0 {
		return nil
	}
	return u
}

// keepUnbilledUntil writes UnbilledFile until ctx ends: every
// keepUnbilledEvery when a charge or a message came, every
// syncUnbilledEvery anyway (the debits lower what it holds). It runs off
// the request path: a write waits for the disk, and the charges this
// process shares must not; NoteCharge only marks a change.
func (s *Service) keepUnbilledUntil(ctx context.Context) {
	defer s.stopped.Done()
	if s.kept.path == "" {
		return // no data_dir: nothing to keep
	}
	tick := time.NewTicker(keepUnbilledEvery)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if s.kept.changed.Load() || now.Sub(last) >= syncUnbilledEvery {
				last = now
				_ = s.keepUnbilled(false) // the file stays as it was; the next round tries again
			}
		}
	}
}

// keepUnbilled writes the charges not debited yet this process counts,
// its own and the others', to UnbilledFile, when they changed since it
// was last written. It syncs the file at most once every
// syncUnbilledEvery, or always.
func (s *Service) keepUnbilled(always bool) error {
	if s.kept.path == "" || !s.snap.accountsLoaded() {
		return nil // before the accounts are loaded, every charge would look gone
	}
	s.kept.changed.Store(false) // before reading: a change during the read is written next round
	kept := unbilledKept{Process: s.share.process, Accounts: make(map[string]keptCharges)}
	s.unbilled.Range(func(k, v any) bool {
		e, ok := s.snap.account(k.(string))
		if !ok {
			return true
		}
		u := v.(*unbilled)
		u.mu.Lock()
		c := keptCharges{Pending: int64(u.pending(e.debited)), Debited: int64(e.debited), Charged: int64(u.charged)}
		countedFrom := int64(u.debitedAt)
		c.CountedFrom = &countedFrom
		for process, p := range u.peers {
			if p.total-p.base <= 0 && p.pending <= 0 && !p.replaced {
				continue // nothing of it counts
			}
			kp := keptPeer{Total: int64(p.total), Counted: int64(p.total - p.base), Pending: int64(p.pending), Replaced: p.replaced, Waits: int64(p.waits)}
			if p.gone {
				goneDebited := int64(p.goneDebited)
				kp.GoneDebited = &goneDebited
			}
			if c.Peers == nil {
				c.Peers = make(map[string]keptPeer)
			}
			c.Peers[process] = kp
		}
		outstanding := u.outstandingLocked(e.debited)
		u.mu.Unlock()
		if outstanding > 0 || c.Pending > 0 {
			kept.Accounts[k.(string)] = c
		}
		return true
	})
	data, err := json.Marshal(&kept)
	if err != nil {
		return err
	}
	s.kept.mu.Lock()
	defer s.kept.mu.Unlock()
	now := time.Now()
	sync := always || now.Sub(s.kept.syncedAt) >= syncUnbilledEvery
	switch {
	case bytes.Equal(data, s.kept.written):
		if s.kept.unsynced && sync {
			if err := syncFile(s.kept.path); err != nil {
				return fmt.Errorf("syncing %s: %w", s.kept.path, err)
			}
			s.kept.unsynced, s.kept.syncedAt = false, now
		}
		return nil
	case sync:
		// A directory not synced leaves the new content in place, less
		// surely after a power loss only.
		if err := durable.ReplaceFile(s.kept.path, data, 0o600); err != nil && !errors.Is(err, durable.ErrDirNotSynced) {
			return fmt.Errorf("writing %s: %w", s.kept.path, err)
		}
		s.kept.unsynced, s.kept.syncedAt = false, now
	default:
		if err := replaceUnsynced(s.kept.path, data); err != nil {
			return fmt.Errorf("writing %s: %w", s.kept.path, err)
		}
		s.kept.unsynced = true
	}
	s.kept.written = data
	return nil
}

// replaceUnsynced makes path hold data, whole, as durable.ReplaceFile
// does but without its syncs: a process killed leaves the new content
// in place (the page cache keeps it), a power loss may not.
func replaceUnsynced(path string, data []byte) error {
	tmp := path + ".tmp"
	err := os.WriteFile(tmp, data, 0o600)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// syncFile makes what path holds, and its name, durable.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = durable.SyncDir(filepath.Dir(path))
	}
	return err
}
