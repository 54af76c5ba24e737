package config

import (
	"errors"
	"io/fs"
	"os"
)

// readSettingFile reads the file at path, the value of setting, reporting
// why it cannot; what names what the file should be. Every setting that
// names a file the loader reads goes through it, so that each refuses a
// directory, a pipe or a missing file in the same words.
func (l *loader) readSettingFile(path, setting, what string) ([]byte, bool) {
	st, err := os.Stat(path)
	if err == nil && st.IsDir() {
		l.check(false, setting, "%q is a directory; name %s", path, what)
		return nil, false
	}
	if err == nil && !st.Mode().IsRegular() {
		// A pipe or a device would hold the check (and each reload) on
		// its read.
		l.check(false, setting, "%q is not a regular file; name %s", path, what)
		return nil, false
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		// The path is quoted once: a PathError's message repeats it.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		l.check(false, setting, "%q cannot be read: %v; name %s (a relative path is from the working directory)", path, err, what)
		return nil, false
	}
	return b, true
}
