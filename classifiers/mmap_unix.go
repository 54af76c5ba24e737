//go:build unix

package classifiers

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// mapFile maps a copy of path that is the process's own. Mapping the file
// itself shared its pages: a `cp` over it or a `truncate` while the
// gateway ran changed the words under a lookup, or killed the process
// with SIGBUS on the next page read past the new end, which no recover
// catches. The copy is an unnamed file beside it (O_TMPFILE, see
// privateCopy), mapped read-only and shared: only the pages lookups read
// become resident, and they are page cache the kernel may reclaim, as
// the file's own were. Where no such file can be made (a read-only
// directory, a system without O_TMPFILE) the file is read into anonymous
// memory instead, all of it resident.
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
	// The header says how big the file must be: one of another size is
	// refused before it is copied, not after (a 30 GB file named by
	// mistake filled the disk, or memory, before it was found wrong).
	var header [vectorsHeaderSize]byte
	if _, err := f.ReadAt(header[:], 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, false, err
	}
	if _, _, _, _, size, err := vectorsLayout(header[:]); err != nil || int64(size) != st.Size() {
		return nil, false, fmt.Errorf("%s: %w", path, ErrVectorsCorrupt)
	}
	if c, err := privateCopy(f, path, st.Size()); err == nil {
		buf, err := syscall.Mmap(int(c.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
		c.Close() // the mapping keeps the unnamed file
		if err == nil {
			return buf, true, nil
		}
	} else if errors.Is(err, ErrVectorsCorrupt) {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, false, err
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
