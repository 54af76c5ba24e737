//go:build !unix

package meter

import (
	"fmt"
	"os"
)

// lockDir only creates the lock file: there is no portable advisory lock
// outside unix, so nothing stops two processes sharing an outbox there.
func lockDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening outbox lock: %w", err)
	}
	return f, nil
}

func unlockDir(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}
