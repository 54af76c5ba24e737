// Package durable holds what makes a file system change survive a crash.
package durable

import "os"

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
