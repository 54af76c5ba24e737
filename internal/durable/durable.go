// Package durable holds what makes a file system change survive a crash.
package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// SyncDir makes the names created, renamed or removed in dir durable: a
// file's own fsync does not cover its directory entry.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// ErrDirNotSynced wraps ReplaceFile's error when the file is in place but
// its directory could not be synced: the new content is there, only less
// surely after a power loss. Callers for whom that is good enough test
// for it with errors.Is.
var ErrDirNotSynced = errors.New("directory not synced")

// ReplaceFile makes path hold data, whole or not at all, a crash
// included: written aside and synced, renamed over path, the directory
// synced. Without the syncs, a power loss soon after the rename can leave
// path empty: the rename reached the disk, the data had not.
func ReplaceFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	err = writeAndClose(f, data)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("%w: %w", ErrDirNotSynced, err)
	}
	return nil
}

// CreateFile makes path hold data unless it exists, a crash included:
// written aside (mode 0600, never wider on the way) and synced, then
// linked into place, which unlike a rename fails when path exists. Of
// two processes creating it at once, one links and the other gets
// created false and reads the whole file the first one linked. The
// directory's sync is best effort: failing it only weakens durability,
// and without it a power loss soon after a first start could lose the
// file (and with a secret, what was signed with it).
func CreateFile(path string, data []byte) (created bool, err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	err = writeAndClose(tmp, data)
	if err == nil {
		err = os.Link(tmp.Name(), path)
	}
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_ = SyncDir(dir)
	return true, nil
}

// writeAndClose writes data to f, syncs and closes it: the file written
// aside that ReplaceFile and CreateFile then put in place.
func writeAndClose(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
