//go:build linux

package overlay

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The live-mount cache answers as the mount table does, and goes back to
// the table when the mount it remembers is gone or covered.
func TestLiveMountCache(t *testing.T) {
	requireRoot(t)
	upper, target, mountOverlay := testOverlay(t)

	var c LiveCache
	want := func(what string, target string, readonly, cached bool) {
		t.Helper()
		got, err := c.Find(upper)
		if err != nil {
			t.Fatal(err)
		}
		table, err := Find(upper)
		if err != nil {
			t.Fatal(err)
		}
		if got.Target != target || got.Readonly != readonly || got != table {
			t.Fatalf("%s: cache says %+v, mount table %+v; want target %q read-only %v", what, got, table, target, readonly)
		}
		if _, ok := c.byUpper[upper]; ok != cached {
			t.Fatalf("%s: cached %v, want %v", what, ok, cached)
		}
	}
	want("first lookup", target, false, true)
	want("cached lookup", target, false, true)

	if err := Remount(Live{Target: target, Options: "rw,relatime"}, true); err != nil {
		t.Fatal(err)
	}
	want("sealed", target, true, true)
	if err := Remount(Live{Target: target, Options: "rw,relatime"}, false); err != nil {
		t.Fatal(err)
	}
	want("unsealed", target, false, true)

	// A read-only mount of a writable superblock is not sealed: the
	// container's own mount of it is still writable.
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	want("read-only mount", target, false, true)
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	want("writable mount", target, false, true)

	// Covered by another mount: the path no longer reaches the overlay, so
	// nothing is cached, but the table still names its mount point.
	if err := unix.Mount("tmpfs", target, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	want("covered", target, false, false)
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	want("uncovered", target, false, true)

	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	want("unmounted", "", false, false)
	mountOverlay()
	want("mounted again", target, false, true)
}

// testOverlay mounts an overlay of empty directories in a temporary
// directory, unmounted when the test ends. It returns its upper, its mount
// point and how to mount it there again.
func testOverlay(t *testing.T) (upper, target string, mount func()) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	upper, target = filepath.Join(dir, "u"), filepath.Join(dir, "m")
	mount = func() {
		t.Helper()
		opts := "lowerdir=" + filepath.Join(dir, "l") + ",upperdir=" + upper + ",workdir=" + filepath.Join(dir, "w")
		if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
			t.Fatal(err)
		}
	}
	mount()
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
	return upper, target, mount
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts overlays and must run as root (make test does)")
	}
}
