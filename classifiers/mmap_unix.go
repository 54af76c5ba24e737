//go:build unix

package classifiers

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// mapFile reads path into memory of the process's own, mapped anonymous
// and then made read-only: off the Go heap, so the collector neither
// scans it nor counts it toward the next collection. The file is read,
// not mapped, because a mapping of it would share the file's pages: a
// `cp` over the file or a `truncate` while the gateway runs would then
// change the words under a lookup, or kill the process with SIGBUS on
// the next page read past the new end, which no recover catches.
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
	buf, err = syscall.Mmap(-1, 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		// Without anonymous mappings the copy goes on the heap.
		b, rerr := readWhole(path)
		return b, false, rerr
	}
	if err := readExactly(f, buf); err != nil {
		syscall.Munmap(buf)
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	// A stray write into the vectors faults at once instead of changing
	// what every later lookup reads.
	if err := syscall.Mprotect(buf, syscall.PROT_READ); err != nil {
		syscall.Munmap(buf)
		return nil, false, err
	}
	return buf, true, nil
}

// readExactly fills buf from f and checks that f ends there: a file cut
// short or grown while it was read is being rewritten, and what was read
// is a mix of two files.
func readExactly(f *os.File, buf []byte) error {
	if _, err := io.ReadFull(f, buf); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return ErrVectorsCorrupt
		}
		return err
	}
	var one [1]byte
	if n, _ := f.Read(one[:]); n != 0 {
		return ErrVectorsCorrupt
	}
	return nil
}

func unmapFile(buf []byte) error { return syscall.Munmap(buf) }
