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
// account's debits stood at Debited.
type keptCharges struct {
	Pending int64 `json:"pending_nanos"`
	Debited int64 `json:"debited_nanos"`
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
				if c.Pending > 0 {
					pending := money.Nanos(c.Pending)
					s.unbilled.Store(account, &unbilled{charged: pending, total: pending, debitedAt: money.Nanos(c.Debited), restored: pending})
					s.share.charged.Store(true) // its heartbeats tell the others
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

// keepUnbilled writes this process's charges not debited yet to
// UnbilledFile, when they changed since it was last written.
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
		pending := u.pending(e.debited)
		u.mu.Unlock()
		if pending > 0 {
			kept.Accounts[k.(string)] = keptCharges{Pending: int64(pending), Debited: int64(e.debited)}
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
