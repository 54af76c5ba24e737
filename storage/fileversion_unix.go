//go:build unix

package storage

import (
	"os"
	"strconv"
	"syscall"
)

// fileVersion tells one write of a file from another: every upload is a
// new file renamed over the old one, so its inode differs from the file it
// replaced; the modification time alone repeats for two uploads within a
// clock tick of the kernel's (a few ms).
func fileVersion(fi os.FileInfo) string {
	v := strconv.FormatInt(fi.ModTime().UnixNano(), 10)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		v += "-" + strconv.FormatUint(st.Ino, 10)
	}
	return v
}
