package classifiers

import (
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// privateCopy copies f, size bytes, into a file with no name in path's
// directory (O_TMPFILE): nothing else can open it, and it is gone once
// the last descriptor and mapping of it are. On the file system of the
// original, io.Copy copies in the kernel (copy_file_range), sharing
// extents where the file system can. A file cut or grown while it was
// copied is being rewritten: ErrVectorsCorrupt.
func privateCopy(f *os.File, path string, size int64) (*os.File, error) {
	fd, err := unix.Open(filepath.Dir(path), unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	c := os.NewFile(uintptr(fd), path+" (private copy)")
	n, err := io.Copy(c, f)
	if err == nil && n != size {
		err = ErrVectorsCorrupt
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
