package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// VectorsPath is the word-vectors file the gateway's default config
// names, as a test finds it: $TOLLGATE_VECTORS, else data/vectors/en.tgv
// under the repository root (the folder holding go.mod). Tests that need
// it never skip: a missing file is an error that says how to install it.
func VectorsPath() (string, error) {
	path := os.Getenv("TOLLGATE_VECTORS")
	if path == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		path = filepath.Join(root, "data", "vectors", "en.tgv")
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("word vectors: %w: run scripts/vectors.sh install (make test does)", err)
	}
	return path, nil
}

// repoRoot is the nearest folder above the working directory that holds
// go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = parent
	}
}
