//go:build linux

package snapshotter

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNodeOverlayDefaultsOn: on a node whose overlay makes redirects and
// metacopy files by default (Ubuntu's kernels: redirect_dir on), a branch
// that renames a directory of its parent (mv) and changes a parent's
// file's mode commits, as on any other node. Before, the rename was
// recorded as a redirect xattr and the chmod as a metadata-only copy, and
// the commit was refused as not implemented. The node's defaults are the
// overlay module's parameters, set for the test and put back after.
func TestNodeOverlayDefaultsOn(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	// A mount takes the defaults when it is made: they are the node's
	// for as short a time as that takes (the other packages' tests run
	// beside this one).
	restore := setOverlayParams(t, map[string]string{"redirect_dir": "Y", "metacopy": "Y"})
	dir := mountAt(t, kids[0].Mounts)
	restore()
	if err := os.Rename(filepath.Join(dir, "app"), filepath.Join(dir, "renamed")); !errors.Is(err, unix.EXDEV) {
		t.Fatalf("rename of a directory of the parent in the branch: %v, want EXDEV (no redirect)", err)
	}
	if out, err := exec.Command("mv", filepath.Join(dir, "app"), filepath.Join(dir, "renamed")).CombinedOutput(); err != nil {
		t.Fatalf("mv: %v: %s", err, out)
	}
	if err := os.Chmod(filepath.Join(dir, "etc", "base.conf"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatalf("commit of the branch: %v", err)
	}
	m, err := s.Mounts(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	root := mountAt(t, m)
	if got := readFile(t, filepath.Join(root, "renamed", "main.txt")); got != "version 1\n" {
		t.Fatalf("the renamed directory's file after the commit: %q", got)
	}
	if _, err := os.Stat(filepath.Join(root, "app")); !os.IsNotExist(err) {
		t.Fatalf("the directory renamed away is still there after the commit: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc", "base.conf")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the file whose mode changed, after the commit: %v, %v", fi.Mode(), err)
	}
	if got := readFile(t, filepath.Join(root, "etc", "base.conf")); got != "from the image\n" {
		t.Fatalf("the file whose mode changed reads %q", got)
	}
}

// setOverlayParams sets the overlay module's parameters (name: value)
// until restore is called or the test ends; a kernel without one skips
// the test (its overlay has no such feature to turn off).
func setOverlayParams(t *testing.T, params map[string]string) (restore func()) {
	t.Helper()
	old := map[string][]byte{}
	restore = func() {
		for name, v := range old {
			if err := os.WriteFile("/sys/module/overlay/parameters/"+name, v, 0); err != nil {
				t.Errorf("put the overlay module's %s back: %v", name, err)
			}
		}
		clear(old)
	}
	t.Cleanup(restore)
	for name, v := range params {
		p := "/sys/module/overlay/parameters/" + name
		b, err := os.ReadFile(p)
		if err != nil {
			t.Skipf("overlay without %s: %v", name, err)
		}
		old[name] = b
		if err := os.WriteFile(p, []byte(v), 0); err != nil {
			t.Fatalf("set %s: %v", p, err)
		}
	}
	return restore
}
