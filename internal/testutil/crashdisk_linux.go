package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// CrashableDisk mounts a new ext4 file system of size bytes (a loop
// device) for the test, and returns its mount point and afterCrash.
// afterCrash mounts a copy of what the device holds at that instant, as a
// machine that lost power then would find it once the journal is
// replayed, and returns that copy's mount point: what a process wrote and
// did not sync is not there. It needs mkfs.ext4 and root, as SmallDisk.
func CrashableDisk(t testing.TB, size int64) (dir string, afterCrash func() string) {
	t.Helper()
	images := t.TempDir()
	image := filepath.Join(images, "disk.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, size); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", image)
	dir = t.TempDir()
	mountLoop(t, image, dir)
	return dir, func() string {
		t.Helper()
		// The loop device writes into the image through its page cache,
		// which a read sees: the copy is what the device holds.
		held, err := os.ReadFile(image)
		if err != nil {
			t.Fatal(err)
		}
		crashed := filepath.Join(images, fmt.Sprintf("crashed-%d.img", len(held)))
		if err := os.WriteFile(crashed, held, 0o600); err != nil {
			t.Fatal(err)
		}
		at := t.TempDir()
		mountLoop(t, crashed, at)
		return at
	}
}

// mountLoop mounts image at dir until the test ends; umount frees the
// loop device mount -o loop took.
func mountLoop(t testing.TB, image, dir string) {
	t.Helper()
	run(t, "mount", "-o", "loop", image, dir)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s (needs root, as make test has)", name, args, err, out)
	}
}
