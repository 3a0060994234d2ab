//go:build linux

package apply

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/fstest"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts overlays and must run as root (make test does)")
	}
}

// mountOverlay mounts an overlay at mnt and returns an idempotent unmount,
// also registered as a cleanup so a failing test leaves no mount behind.
// An empty upper gives a read-only mount of the lowers alone.
func mountOverlay(t testing.TB, mnt, upper, work string, lowers ...string) func() {
	t.Helper()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := "lowerdir=" + strings.Join(lowers, ":")
	var flags uintptr
	if upper != "" {
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		opts += ",upperdir=" + upper + ",workdir=" + work
	} else {
		flags = unix.MS_RDONLY
	}
	if err := unix.Mount("overlay", mnt, "overlay", flags, opts); err != nil {
		t.Fatalf("mount overlay %s: %v", opts, err)
	}
	done := false
	unmount := func() {
		if done {
			return
		}
		done = true
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	}
	t.Cleanup(unmount)
	return unmount
}

// oracle is one commit checked against the kernel: base builds the lower L;
// change writes through a real overlay mount of L, so the upper U is made by
// the kernel. want is then a mount of U over L; the commit applies U onto a
// fresh overlay mount of L, through the mount, and the two must be equal.
type oracle struct {
	dir, L, U, Want, Target string
	stats                   Stats
}

func runOracle(t testing.TB, base, change func(t testing.TB, root string)) *oracle {
	t.Helper()
	requireRoot(t)
	o := &oracle{dir: t.TempDir()}
	o.L = filepath.Join(o.dir, "L")
	o.U = filepath.Join(o.dir, "U")
	o.Want = filepath.Join(o.dir, "want")
	o.Target = filepath.Join(o.dir, "target")
	if err := os.Mkdir(o.L, 0o755); err != nil {
		t.Fatal(err)
	}
	base(t, o.L)
	unmount := mountOverlay(t, filepath.Join(o.dir, "M"), o.U, filepath.Join(o.dir, "W"), o.L)
	change(t, filepath.Join(o.dir, "M"))
	unmount()

	mountOverlay(t, o.Want, "", "", o.U, o.L)
	u2 := filepath.Join(o.dir, "U2")
	mountOverlay(t, o.Target, u2, filepath.Join(o.dir, "W2"), o.L)
	st, err := Apply(context.Background(), o.U, o.Target, WithTargetUpper(u2))
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	o.stats = st
	if err := fstest.Compare(o.Want, o.Target); err != nil {
		t.Fatal(err)
	}
	// Again, now that target's upper holds what the first one wrote: the
	// entries are replaced by exchange, and the result must not change.
	if _, err := Apply(context.Background(), o.U, o.Target, WithTargetUpper(u2)); err != nil {
		t.Fatalf("Apply again: %v", err)
	}
	if err := fstest.Compare(o.Want, o.Target); err != nil {
		t.Fatalf("after applying again: %v", err)
	}
	checkNoTemps(t, o.Target)
	return o
}

// checkNoTemps fails if any TempPrefix entry is left under root.
func checkNoTemps(t testing.TB, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), TempPrefix) {
			return fmt.Errorf("temporary %s left", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// fsT is the subset of testing.TB the tree builders use, so one builder
// serves tests, benchmarks and the fuzz target.
type fsT interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func must(t fsT, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t fsT, p string, data string, mode os.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(data), mode))
	must(t, os.Chmod(p, mode))
}

// snapshotTree records a tree for a later no-change check.
func snapshotTree(t testing.TB, root string) fstest.Tree {
	t.Helper()
	tr, err := fstest.Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// sentinel makes a directory of files that nothing may read or change: its
// file contents are a marker that must never show up in a target.
func sentinel(t testing.TB, dir string) {
	t.Helper()
	write(t, filepath.Join(dir, "secret"), secretMarker, 0o600)
	write(t, filepath.Join(dir, "sub/secret2"), secretMarker, 0o644)
	must(t, os.Symlink("secret", filepath.Join(dir, "selflink")))
}

const secretMarker = "SENTINEL-SECRET-5f1d2c"

// checkNoSecret fails if any file under root holds the sentinel marker, that
// is if Apply read a file outside upper and copied it in.
func checkNoSecret(t fsT, root string) {
	t.Helper()
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if strings.Contains(string(b), secretMarker) {
				t.Fatalf("%s holds data from outside upper", p)
			}
		}
		return nil
	})
	must(t, err)
}
