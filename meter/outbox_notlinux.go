//go:build !linux

package meter

import "os"

// reserveDisk is Linux's fallocate; elsewhere a truncate sizes the file and
// reserves nothing.
func reserveDisk(*os.File, int) error { return errNoReserve }

// populateMapped is Linux only; elsewhere the pages are touched one by one.
func populateMapped([]byte) (bool, error) { return false, nil }
