//go:build unix

package classifiers

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps path read-only and shared: the pages are the page cache's,
// so several gateways on one machine share one copy, and only pages that
// are read count in a process's resident memory.
func mapFile(path string) (buf []byte, mapped bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if st.Size() == 0 {
		return nil, false, fmt.Errorf("%s: %w", path, ErrVectorsCorrupt)
	}
	buf, err = syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		// A file system without mmap still gets an engine: read it.
		b, rerr := readWhole(path)
		return b, false, rerr
	}
	return buf, true, nil
}

func unmapFile(buf []byte) error { return syscall.Munmap(buf) }
