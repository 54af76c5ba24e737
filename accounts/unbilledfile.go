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

// keepUnbilledEvery is how often UnbilledFile is rewritten, when what it
// holds changed: what a crash can lose is the charges of the last second,
// and a stop loses none (Close writes it).
const keepUnbilledEvery = time.Second

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
}

// keeper writes UnbilledFile.
type keeper struct {
	path    string // "" in a process that keeps none (no data_dir)
	mu      sync.Mutex
	written []byte // what the file holds
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
		p := &peerCharges{total: money.Nanos(kp.Total), pending: money.Nanos(max(kp.Pending, 0)), gone: true, goneDebited: money.Nanos(c.Debited), replaced: kp.Replaced}
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

// keepUnbilledUntil writes UnbilledFile every keepUnbilledEvery until ctx
// ends, off the request path: a write waits for the disk (durable's
// syncs), and the charges this process shares must not.
func (s *Service) keepUnbilledUntil(ctx context.Context) {
	defer s.stopped.Done()
	tick := time.NewTicker(keepUnbilledEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_ = s.keepUnbilled() // the file stays as it was; the next round tries again
		}
	}
}

// keepUnbilled writes the charges not debited yet this process counts,
// its own and the others', to UnbilledFile, when they changed since it
// was last written.
func (s *Service) keepUnbilled() error {
	if s.kept.path == "" || !s.snap.accountsLoaded() {
		return nil // before the accounts are loaded, every charge would look gone
	}
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
			if p.total-p.base <= 0 && p.pending <= 0 {
				continue // nothing of it counts
			}
			kp := keptPeer{Total: int64(p.total), Counted: int64(p.total - p.base), Pending: int64(p.pending), Replaced: p.replaced}
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
	if bytes.Equal(data, s.kept.written) {
		return nil
	}
	// A directory not synced leaves the new content in place, less surely
	// after a power loss only.
	if err := durable.ReplaceFile(s.kept.path, data, 0o600); err != nil && !errors.Is(err, durable.ErrDirNotSynced) {
		return fmt.Errorf("writing %s: %w", s.kept.path, err)
	}
	s.kept.written = data
	return nil
}
