//go:build !unix

package meter

import (
	"errors"
	"os"
)

var errNoMmap = errors.New("the outbox needs a Unix system (memory-mapped segments)")

func allocateAndMap(*os.File, int) ([]byte, error) { return nil, errNoMmap }
func syncMapped([]byte) error                      { return errNoMmap }
func unmap([]byte) error                           { return nil }
