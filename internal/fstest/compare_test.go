//go:build linux

package fstest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var epoch = time.Unix(1700000000, 123456789)

// build makes the same tree every time, with fixed times.
func build(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "d/sub"), 0o755))
	must(os.WriteFile(filepath.Join(root, "d/f"), []byte("hello"), 0o644))
	must(os.WriteFile(filepath.Join(root, "d/sub/g"), []byte("world"), 0o600))
	must(os.Link(filepath.Join(root, "d/f"), filepath.Join(root, "d/f2")))
	must(os.WriteFile(filepath.Join(root, "other"), []byte("hello"), 0o644))
	must(os.Symlink("d/f", filepath.Join(root, "ln")))
	must(unix.Mknod(filepath.Join(root, "chr"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	must(unix.Setxattr(filepath.Join(root, "other"), "user.k", []byte("v"), 0))
	f, err := os.Create(filepath.Join(root, "sparse"))
	must(err)
	_, err = f.WriteAt([]byte("x"), 1<<20)
	must(err)
	must(f.Close())
	must(filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		must(err)
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{unix.NsecToTimespec(epoch.UnixNano()), unix.NsecToTimespec(epoch.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW)
	}))
}

func setTime(t *testing.T, p string) {
	t.Helper()
	ts := unix.NsecToTimespec(epoch.UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

func TestCompareEqual(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	build(t, a)
	build(t, b)
	setTime(t, a)
	setTime(t, b)
	if err := Compare(a, b); err != nil {
		t.Fatal(err)
	}
	// Overlay's private user.overlay.* xattrs are not part of the view.
	if err := unix.Setxattr(filepath.Join(a, "d"), "user.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if err := Compare(a, b); err != nil {
		t.Fatalf("user.overlay.* xattr should be ignored: %v", err)
	}
}

// TestCompareCatches changes one thing at a time and checks that Diff
// reports exactly that kind of difference at that path.
func TestCompareCatches(t *testing.T) {
	for _, tc := range []struct {
		name, path, what string
		change           func(t *testing.T, root string) error
		keepTime         bool // the change sets times itself
	}{
		{"missing", "other", "presence", func(_ *testing.T, r string) error { return os.Remove(filepath.Join(r, "other")) }, false},
		{"extra", "new", "presence", func(_ *testing.T, r string) error { return os.WriteFile(filepath.Join(r, "new"), nil, 0o644) }, false},
		{"type", "other", "type", func(_ *testing.T, r string) error {
			if err := os.Remove(filepath.Join(r, "other")); err != nil {
				return err
			}
			return os.Mkdir(filepath.Join(r, "other"), 0o644)
		}, false},
		{"mode", "d/f", "mode", func(_ *testing.T, r string) error { return os.Chmod(filepath.Join(r, "d/f"), 0o640) }, false},
		{"setuid", "d/f", "mode", func(_ *testing.T, r string) error { return os.Chmod(filepath.Join(r, "d/f"), 0o644|os.ModeSetuid) }, false},
		{"sticky dir", "d", "mode", func(_ *testing.T, r string) error { return os.Chmod(filepath.Join(r, "d"), 0o755|os.ModeSticky) }, false},
		{"owner", "d/sub/g", "owner", func(_ *testing.T, r string) error { return os.Lchown(filepath.Join(r, "d/sub/g"), 1000, 1000) }, false},
		{"symlink owner", "ln", "owner", func(_ *testing.T, r string) error { return os.Lchown(filepath.Join(r, "ln"), 7, 7) }, false},
		{"size", "d/sub/g", "size", func(_ *testing.T, r string) error {
			return os.WriteFile(filepath.Join(r, "d/sub/g"), []byte("world!"), 0o600)
		}, false},
		{"content", "d/sub/g", "content", func(_ *testing.T, r string) error {
			return os.WriteFile(filepath.Join(r, "d/sub/g"), []byte("WORLD"), 0o600)
		}, false},
		{"symlink target", "ln", "symlink target", func(_ *testing.T, r string) error {
			if err := os.Remove(filepath.Join(r, "ln")); err != nil {
				return err
			}
			return os.Symlink("d/X", filepath.Join(r, "ln"))
		}, false},
		{"rdev", "chr", "rdev", func(_ *testing.T, r string) error {
			if err := os.Remove(filepath.Join(r, "chr")); err != nil {
				return err
			}
			return unix.Mknod(filepath.Join(r, "chr"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 5)))
		}, false},
		{"file mtime", "d/f", "mtime", func(_ *testing.T, r string) error {
			return os.Chtimes(filepath.Join(r, "d/f"), epoch, epoch.Add(time.Nanosecond))
		}, true},
		{"dir mtime", "d/sub", "mtime", func(_ *testing.T, r string) error {
			return os.Chtimes(filepath.Join(r, "d/sub"), epoch, epoch.Add(time.Second))
		}, true},
		{"user xattr", "d/f", "xattrs", func(_ *testing.T, r string) error {
			return unix.Setxattr(filepath.Join(r, "d/f"), "user.new", []byte("1"), 0)
		}, false},
		{"xattr value", "other", "xattrs", func(_ *testing.T, r string) error {
			return unix.Setxattr(filepath.Join(r, "other"), "user.k", []byte("w"), 0)
		}, false},
		{"security xattr", "d/sub/g", "xattrs", func(_ *testing.T, r string) error {
			return unix.Setxattr(filepath.Join(r, "d/sub/g"), "security.bbtest", []byte("1"), 0)
		}, false},
		{"hard link broken", "d/f2", "hard links", func(_ *testing.T, r string) error {
			p := filepath.Join(r, "d/f2")
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.WriteFile(p, []byte("hello"), 0o644)
		}, false},
		{"hard link made", "other", "hard links", func(_ *testing.T, r string) error {
			p := filepath.Join(r, "other")
			if err := os.Remove(p); err != nil {
				return err
			}
			if err := os.Link(filepath.Join(r, "d/sub/g"), p); err != nil {
				return err
			}
			// Same attributes as before otherwise, so only links differ.
			if err := os.Chmod(p, 0o644); err != nil {
				return err
			}
			return nil
		}, false},
		{"sparse layout", "sparse", "sparse layout", func(_ *testing.T, r string) error {
			// Same bytes, but the hole is now written zeros.
			f, err := os.OpenFile(filepath.Join(r, "sparse"), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt(make([]byte, 1<<20), 0)
			return err
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := t.TempDir(), t.TempDir()
			if tc.name == "sparse layout" && tempOnXFS(a) {
				t.Skip("layouts are not compared on XFS (onXFS)")
			}
			build(t, a)
			build(t, b)
			if err := tc.change(t, b); err != nil {
				t.Fatal(err)
			}
			if !tc.keepTime {
				// Undo the time side effects so only the change itself shows.
				_ = filepath.Walk(b, func(p string, _ os.FileInfo, _ error) error {
					setTime(t, p)
					return nil
				})
			}
			setTime(t, a)
			setTime(t, b)
			diffs, err := Diff(a, b)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, d := range diffs {
				if d.Path == tc.path && d.What == tc.what {
					found = true
				}
			}
			if !found {
				t.Fatalf("want a %q difference at %s, got %v", tc.what, tc.path, diffs)
			}
			if Compare(a, b) == nil {
				t.Fatal("Compare returned nil for differing trees")
			}
		})
	}
}

func tempOnXFS(dir string) bool {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return onXFS(fd)
}
