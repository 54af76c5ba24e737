//go:build !unix

package storage

import (
	"os"
	"strconv"
)

// fileVersion is the modification time where the inode cannot be read:
// two uploads within one tick of the clock look alike.
func fileVersion(fi os.FileInfo) string {
	return strconv.FormatInt(fi.ModTime().UnixNano(), 10)
}
