//go:build !linux && !darwin && !freebsd

package broker

import "errors"

// freeBytes is not known here; roomToWrite then only checks that
// a file can be written.
func freeBytes(string) (int64, error) {
	return 0, errors.ErrUnsupported
}
