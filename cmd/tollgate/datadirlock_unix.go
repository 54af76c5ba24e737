//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDataDir makes data_dir if missing and takes an exclusive lock on
// data_dir/LOCK, held until unlock (or the process's end: the kernel drops
// it on any exit, SIGKILL included). Taken before anything opens a store
// in data_dir: a second serve on a running gateway's data_dir started its
// embedded NATS on the live store, rewrote the streams' index files, and
// only then found the outbox locked.
func lockDataDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data_dir: %w", err)
	}
	p := filepath.Join(dir, dataDirLockFile)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the data_dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held by another tollgate serve; stop it, or give this one its own data_dir (TOLLGATE_DATA_DIR)", errDataDirInUse, p)
		}
		return nil, fmt.Errorf("locking data_dir: %w", err)
	}
	return func() { _ = f.Close() }, nil // closing the descriptor releases the lock
}
