//go:build unix && !linux

package classifiers

import (
	"errors"
	"os"
)

// privateCopy has no unnamed files to make outside Linux: mapFile reads
// the file into anonymous memory instead.
func privateCopy(*os.File, string, int64) (*os.File, error) {
	return nil, errors.New("no O_TMPFILE")
}
