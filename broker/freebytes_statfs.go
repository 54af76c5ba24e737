//go:build linux || darwin || freebsd

package broker

import "golang.org/x/sys/unix"

// freeBytes is the space an unprivileged process may still write on
// dir's disk.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(uint64(st.Bavail) * uint64(st.Bsize)), nil
}
