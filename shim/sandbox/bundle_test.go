//go:build linux

package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// TestRemoveBundleLeftMounts: a tmpfs a killed restore left mounted in a
// branch's bundle is detached, not emptied, and the bundle goes.
func TestRemoveBundleLeftMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	bundle := filepath.Join(t.TempDir(), "3")
	left := filepath.Join(bundle, restoreWorkDir, "tmpfs-1", "0")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", left, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(left, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(left, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// What a branch would see of it, kept open across the removal.
	d, err := os.Open(left)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	removeBundle(context.Background(), bundle)
	if mounted, err := mountinfo.Mounted(left); err == nil && mounted {
		t.Fatal("the tmpfs is still mounted")
	}
	if _, err := os.Stat(bundle); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bundle: %v; want it removed", err)
	}
	if names, err := d.Readdirnames(-1); err != nil || len(names) != 1 {
		t.Fatalf("the tmpfs's content after the removal: %v %v; want it kept", names, err)
	}
}
