//go:build unix

package rawconn

import "syscall"

// DescriptorLimit is the process's limit on open files (the soft
// RLIMIT_NOFILE, which Go raises to the hard limit at start), and
// whether it could be read.
func DescriptorLimit() (uint64, bool) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, false
	}
	return uint64(l.Cur), true
}
