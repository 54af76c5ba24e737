//go:build unix

package meter

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// allocateAndMap reserves size bytes of disk for f and maps them shared,
// so that writing the mapping puts records in the page cache without a
// system call, and a full disk shows here, as an error, rather than as a
// SIGBUS when a page is first written.
func allocateAndMap(f *os.File, size int) ([]byte, error) {
	if err := reserveDisk(f, size); err != nil {
		if err != errNoReserve {
			return nil, fmt.Errorf("reserving %d bytes for an outbox segment: %w", size, err)
		}
		// A file system without fallocate: a plain truncate reserves
		// nothing, so a full disk may only show when a page is written.
		if err := f.Truncate(int64(size)); err != nil {
			return nil, fmt.Errorf("sizing an outbox segment: %w", err)
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping an outbox segment: %w", err)
	}
	return mem, nil
}

// syncMapped writes mem's dirty pages to disk and waits for it.
func syncMapped(mem []byte) error { return unix.Msync(mem, unix.MS_SYNC) }

func unmap(mem []byte) error { return unix.Munmap(mem) }
