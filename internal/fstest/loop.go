//go:build linux

package fstest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// LoopExt4 makes an ext4 filesystem of sizeMB in a file, mounts it through
// a loop device and returns its mount point, for tests that fill a disk
// (root only). The unmount (which frees the loop device: mount -o loop
// sets it to clear itself) is registered first, so it runs after every
// cleanup registered later.
func LoopExt4(t testing.TB, sizeMB int) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	run("truncate", "-s", fmt.Sprintf("%dM", sizeMB), img)
	// -m 0: no blocks reserved for root, so "free" means the same to the
	// code under test, to the test's filler and to df.
	run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", img)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run("mount", "-o", "loop", img, mnt)
	t.Cleanup(func() {
		if err := umount(mnt); err != nil {
			t.Error(err)
			return
		}
		// The loop device clears itself once the unmount lets go of it.
		for i := 0; ; i++ {
			out, _ := exec.Command("losetup", "-j", img).CombinedOutput()
			if len(bytes.TrimSpace(out)) == 0 {
				break
			}
			if i == 100 {
				t.Errorf("loop device left for %s: %s", img, out)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return mnt
}

// umount unmounts mnt. Overlays over it that were detached lazily let go
// of it soon after, not at once: a busy unmount is retried for a while.
func umount(mnt string) error {
	for i := 0; ; i++ {
		out, err := exec.Command("umount", mnt).CombinedOutput()
		if err == nil {
			return nil
		}
		if i == 100 || !bytes.Contains(out, []byte("busy")) {
			return fmt.Errorf("umount %s: %v: %s", mnt, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// LoopDevice is the name of the loop device under a filesystem of
// LoopExt4's ("loop0"), as /sys/block and /sys/fs/ext4 name it.
func LoopDevice(t testing.TB, mnt string) string {
	t.Helper()
	src, err := exec.Command("findmnt", "-n", "-o", "SOURCE", mnt).Output()
	if err != nil {
		t.Fatalf("findmnt %s: %v", mnt, err)
	}
	return filepath.Base(strings.TrimSpace(string(src)))
}

// ErrorLoopExt4 makes a filesystem of LoopExt4's read-only as an error
// does on a node whose fstab says errors=remount-ro (ext4's emergency
// read-only state: no remount makes it writable again, RepairLoopExt4
// does).
func ErrorLoopExt4(t testing.TB, mnt string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,errors=remount-ro", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount %s: %v: %s", mnt, err, out)
	}
	if err := os.WriteFile(filepath.Join("/sys/fs/ext4", LoopDevice(t, mnt), "trigger_fs_error"), []byte("1"), 0o200); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "probe"), nil, 0o600); !errors.Is(err, unix.EROFS) {
		t.Fatalf("%s after the error: a write gave %v, want read-only", mnt, err)
	}
}

// RepairLoopExt4 does to a filesystem of LoopExt4's what a node's boot
// does to one left with errors: unmounted (nothing of the test may hold
// it), checked and repaired by e2fsck, and mounted again where it was.
func RepairLoopExt4(t testing.TB, mnt string) {
	t.Helper()
	if err := umount(mnt); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(filepath.Dir(mnt), "img")
	// Exit status 1: errors corrected.
	if out, err := exec.Command("e2fsck", "-fy", img).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("e2fsck %s: %v: %s", img, err, out)
		}
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s again: %v: %s", img, err, out)
	}
}

// Tmpfs mounts a tmpfs with the mount data given (its size and mode, say)
// at dir, which it makes if missing, and detaches it at cleanup: register
// it before what must be gone first (cleanups run last first).
func Tmpfs(t testing.TB, dir, data string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, data); err != nil {
		t.Fatalf("mount a tmpfs (%s) at %s: %v", data, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}
