//go:build !unix

package classifiers

// mapFile reads the whole file where memory mapping is not wired up.
func mapFile(path string) (buf []byte, mapped bool, err error) {
	b, err := readWhole(path)
	return b, false, err
}

func unmapFile([]byte) error { return nil }
