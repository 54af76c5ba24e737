package durable

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCreateFileKeepsTheFirstWriterAndLeavesNothingAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secret")
	created, err := CreateFile(path, []byte("first\n"))
	if err != nil || !created {
		t.Fatalf("first CreateFile: created %v, err %v", created, err)
	}
	created, err = CreateFile(path, []byte("second\n"))
	if err != nil || created {
		t.Fatalf("second CreateFile: created %v, err %v; want false, nil", created, err)
	}
	data, err := os.ReadFile(path)
	if err != nil || string(data) != "first\n" {
		t.Fatalf("content %q, %v; want the first writer's", data, err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600: secrets live in these files", info.Mode().Perm(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the file: a temp file was left", len(entries))
	}
}
