//go:build unix

package meter

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive lock on path, created if missing. The kernel
// drops it when the process dies, SIGKILL included, so a crash never
// leaves the outbox locked.
func lockDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening outbox lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrOutboxLocked, path)
		}
		return nil, fmt.Errorf("locking outbox: %w", err)
	}
	return f, nil
}

func unlockDir(f *os.File) {
	if f != nil {
		_ = f.Close() // closing the descriptor releases the lock
	}
}
