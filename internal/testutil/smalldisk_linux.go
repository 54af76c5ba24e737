package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// SmallDisk mounts a tmpfs of size bytes for the test: a disk it can fill.
// Where mounting is not allowed (not root) the test fails: make test runs
// as root, and a skip there would leave the full disk untested without a
// word. Unmounted when the test ends, after the cleanups the test
// registers later (a server's Close).
func SmallDisk(t testing.TB, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("mounting a %d-byte tmpfs: %v (needs root, as make test has)", size, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting the test's tmpfs: %v", err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return dir
}

// FillDisk writes dir/filler until dir's disk is full, and returns its
// path: removing it gives the room back.
func FillDisk(t testing.TB, dir string) string {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Big writes first, then small ones for the last pages: a disk left
	// with a few KiB free takes a small record still.
	for _, size := range []int{64 << 10, 4 << 10} {
		chunk := make([]byte, size)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatalf("filling the disk: %v", err)
				}
				break
			}
		}
	}
	return filler
}
