//go:build linux

package apply

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/fstest"
)

// guard is a sentinel directory beside upper and target. check proves that
// nothing in it changed (full comparison) and nothing in it was read: its
// files' atimes are set before their mtimes, so with relatime any read
// would move them.
type guard struct {
	dir    string
	before fstest.Tree
	atimes map[string]unix.Timespec
}

func newGuard(t testing.TB, dir string) *guard {
	t.Helper()
	sentinel(t, dir)
	must(t, os.MkdirAll(filepath.Join(dir, "victim"), 0o755))
	write(t, filepath.Join(dir, "victim/precious"), secretMarker+" precious", 0o644)
	g := &guard{dir: dir, atimes: map[string]unix.Timespec{}}
	must(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		ts := []unix.Timespec{{Sec: 1000000000}, {Sec: 1100000000}}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0); err != nil {
			return err
		}
		g.atimes[p] = ts[0]
		return nil
	}))
	// Scanning reads the files; put their atimes back (mtime untouched).
	g.before = snapshotTree(t, dir)
	for p, at := range g.atimes {
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{at, {Nsec: unix.UTIME_OMIT}}, 0))
	}
	return g
}

func (g *guard) check(t testing.TB) {
	t.Helper()
	// atimes first: the scan below reads the files.
	for p, want := range g.atimes {
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		if st.Atim != want {
			t.Fatalf("Apply read %s outside upper (atime moved)", p)
		}
	}
	if d := fstest.DiffTrees(g.before, snapshotTree(t, g.dir)); len(d) > 0 {
		t.Fatalf("Apply changed the sentinel directory beside it: %v", d)
	}
}

func whiteout(t testing.TB, p string) {
	t.Helper()
	must(t, unix.Mknod(p, unix.S_IFCHR, 0))
}

func opaque(t testing.TB, p string, v string) {
	t.Helper()
	must(t, unix.Setxattr(p, xattrOpaque, []byte(v), 0))
}

// craftedUpper is an upper made by hand to try every way out.
func craftedUpper(t testing.TB, up string) {
	must(t, os.MkdirAll(up, 0o755))
	// Symlinks that point outside are copied as text, never followed.
	must(t, os.Symlink("/", filepath.Join(up, "abs")))
	must(t, os.Symlink("../outside/victim", filepath.Join(up, "esc")))
	must(t, os.Symlink("../outside/secret", filepath.Join(up, "leak")))
	// Where target has a symlink to outside, upper has a directory, a
	// whiteout, a file and an opaque directory.
	write(t, filepath.Join(up, "d/f"), "into d", 0o644)
	whiteout(t, filepath.Join(up, "w"))
	write(t, filepath.Join(up, "viaLink"), "replaces the link, not its target", 0o644)
	write(t, filepath.Join(up, "o/fresh"), "fresh", 0o644)
	opaque(t, filepath.Join(up, "o"), "y")
	// Hard links inside upper, across directories.
	write(t, filepath.Join(up, "h/one"), "linked", 0o644)
	must(t, os.MkdirAll(filepath.Join(up, "h2/sub"), 0o755))
	must(t, os.Link(filepath.Join(up, "h/one"), filepath.Join(up, "h2/sub/two")))
	must(t, os.Link(filepath.Join(up, "h/one"), filepath.Join(up, "d/three")))
}

// hostileTarget plants symlinks to outside where upper has entries.
func hostileTarget(t testing.TB, tgt, outside string) {
	must(t, os.MkdirAll(tgt, 0o755))
	victim := filepath.Join(outside, "victim")
	must(t, os.Symlink(victim, filepath.Join(tgt, "d")))
	must(t, os.Symlink(victim, filepath.Join(tgt, "w")))
	must(t, os.Symlink(filepath.Join(victim, "precious"), filepath.Join(tgt, "viaLink")))
	must(t, os.MkdirAll(filepath.Join(tgt, "o"), 0o755))
	must(t, os.Symlink(victim, filepath.Join(tgt, "o/link")))
	must(t, os.Symlink("../../outside/victim", filepath.Join(tgt, "o/rel")))
	must(t, os.Symlink(victim, filepath.Join(tgt, "h")))
}

func checkCrafted(t testing.TB, tgt string) {
	t.Helper()
	for name, want := range map[string]string{"abs": "/", "esc": "../outside/victim", "leak": "../outside/secret"} {
		if l, err := os.Readlink(filepath.Join(tgt, name)); err != nil || l != want {
			t.Fatalf("%s: symlink %q, %v; want %q", name, l, err, want)
		}
	}
	for _, dir := range []string{"d", "o", "h"} {
		fi, err := os.Lstat(filepath.Join(tgt, dir))
		if err != nil || !fi.IsDir() {
			t.Fatalf("%s should be a real directory now: %v %v", dir, fi, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(tgt, "w")); !os.IsNotExist(err) {
		t.Fatalf("whiteout w: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(tgt, "viaLink")); err != nil || string(b) != "replaces the link, not its target" {
		t.Fatalf("viaLink: %q %v", b, err)
	}
	entries, err := os.ReadDir(filepath.Join(tgt, "o"))
	if err != nil || len(entries) != 1 || entries[0].Name() != "fresh" {
		t.Fatalf("opaque o: %v %v", entries, err)
	}
	var a, b, c unix.Stat_t
	must(t, unix.Lstat(filepath.Join(tgt, "h/one"), &a))
	must(t, unix.Lstat(filepath.Join(tgt, "h2/sub/two"), &b))
	must(t, unix.Lstat(filepath.Join(tgt, "d/three"), &c))
	if a.Ino != b.Ino || a.Ino != c.Ino || a.Nlink != 3 {
		t.Fatalf("hard links inside upper should land as links inside target: %d %d %d nlink %d", a.Ino, b.Ino, c.Ino, a.Nlink)
	}
}

// TestAdversarialCrafted applies a hand-made hostile upper onto a hostile
// target, both as a plain directory and through an overlay mount.
func TestAdversarialCrafted(t *testing.T) {
	requireRoot(t)
	for _, mounted := range []bool{false, true} {
		t.Run("overlay="+strconv.FormatBool(mounted), func(t *testing.T) {
			dir := t.TempDir()
			g := newGuard(t, filepath.Join(dir, "outside"))
			up := filepath.Join(dir, "upper")
			craftedUpper(t, up)
			tgt := filepath.Join(dir, "target")
			if mounted {
				lower := filepath.Join(dir, "lower")
				hostileTarget(t, lower, filepath.Join(dir, "outside"))
				mountOverlay(t, tgt, filepath.Join(dir, "u2"), filepath.Join(dir, "w2"), lower)
			} else {
				hostileTarget(t, tgt, filepath.Join(dir, "outside"))
			}
			if _, err := Apply(context.Background(), up, tgt); err != nil {
				t.Fatal(err)
			}
			checkCrafted(t, tgt)
			checkNoSecret(t, tgt)
			g.check(t)
		})
	}
}

// deepChain makes n nested directories "d" under root through fds (the
// path is far longer than PATH_MAX) and returns nothing; leaf gets a file.
func deepChain(t testing.TB, root string, n int) {
	t.Helper()
	fd, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	must(t, err)
	for range n {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil && err != unix.EEXIST {
			t.Fatal(err)
		}
		nfd, err := unix.Openat(fd, "d", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		must(t, err)
		fd = nfd
	}
	f, err := unix.Openat(fd, "leaf", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	must(t, err)
	unix.Close(f)
	unix.Close(fd)
}

func TestAdversarialDepth(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	t.Run("within limit", func(t *testing.T) {
		dir := t.TempDir()
		up, tgt := filepath.Join(dir, "upper"), filepath.Join(dir, "target")
		must(t, os.Mkdir(up, 0o755))
		must(t, os.Mkdir(tgt, 0o755))
		deepChain(t, up, 1000)
		st, err := Apply(ctx, up, tgt)
		if err != nil {
			t.Fatal(err)
		}
		if st.Dirs != 1000 || st.Files != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("upper too deep", func(t *testing.T) {
		dir := t.TempDir()
		g := newGuard(t, filepath.Join(dir, "outside"))
		up, tgt := filepath.Join(dir, "upper"), filepath.Join(dir, "target")
		must(t, os.Mkdir(up, 0o755))
		must(t, os.Mkdir(tgt, 0o755))
		deepChain(t, up, DefaultMaxDepth+10)
		_, err := Apply(ctx, up, tgt)
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("want invalid argument for a too deep upper, got %v", err)
		}
		if len(err.Error()) > 1024 {
			t.Fatalf("error message of %d bytes", len(err.Error()))
		}
		g.check(t)
	})
	t.Run("target too deep to remove", func(t *testing.T) {
		dir := t.TempDir()
		g := newGuard(t, filepath.Join(dir, "outside"))
		up, tgt := filepath.Join(dir, "upper"), filepath.Join(dir, "target")
		must(t, os.Mkdir(up, 0o755))
		must(t, os.Mkdir(tgt, 0o755))
		whiteout(t, filepath.Join(up, "d"))
		deepChain(t, tgt, 300)
		_, err := Apply(ctx, up, tgt, WithMaxDepth(100))
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("want invalid argument for a too deep target, got %v", err)
		}
		if _, err := Apply(ctx, up, tgt); err != nil {
			t.Fatalf("the default limit removes 300 levels: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(tgt, "d")); !os.IsNotExist(err) {
			t.Fatalf("d not removed: %v", err)
		}
		g.check(t)
	})
}

// TestAdversarialSwapRace swaps directories for symlinks to outside, in
// target and in upper, while Apply runs. Apply may fail; it must never
// write or read outside.
func TestAdversarialSwapRace(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	g := newGuard(t, outside)
	up, tgt := filepath.Join(dir, "upper"), filepath.Join(dir, "target")
	for i := range 100 {
		write(t, filepath.Join(up, "d", "f"+strconv.Itoa(i)), "data", 0o644)
		write(t, filepath.Join(up, "u", "g"+strconv.Itoa(i)), "data", 0o644)
	}
	must(t, os.MkdirAll(filepath.Join(tgt, "d"), 0o755))

	var stop atomic.Bool
	var wg sync.WaitGroup
	swap := func(parent, name string) {
		defer wg.Done()
		p := filepath.Join(parent, name)
		for !stop.Load() {
			if os.Rename(p, p+".real") == nil {
				_ = os.Symlink(filepath.Join(outside, "victim"), p)
				_ = os.Remove(p)
				_ = os.Rename(p+".real", p)
			}
		}
	}
	wg.Add(2)
	go swap(tgt, "d")
	go swap(up, "u")
	var okRuns, failRuns int
	for range 20 {
		if _, err := Apply(context.Background(), up, tgt); err != nil {
			failRuns++
		} else {
			okRuns++
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d applies succeeded, %d failed under the race", okRuns, failRuns)
	checkNoSecret(t, tgt)
	g.check(t)
}

// TestXattrWhiteoutsAndOpaqueX checks the xattr forms against the kernel's
// own reading of the same hand-made upper: an empty file with
// overlay.whiteout hides the lower entry, opaque="x" keeps a directory
// merged, and an opaque mark on the root is ignored.
func TestXattrWhiteoutsAndOpaqueX(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	l, up := filepath.Join(dir, "L"), filepath.Join(dir, "U")
	write(t, filepath.Join(l, "rootfile"), "r", 0o644)
	write(t, filepath.Join(l, "d/a"), "a", 0o644)
	write(t, filepath.Join(l, "d/b"), "b", 0o644)
	write(t, filepath.Join(l, "d/c"), "c", 0o644)
	write(t, filepath.Join(l, "e/gone"), "e", 0o644)
	write(t, filepath.Join(up, "d/a"), "", 0o644)
	must(t, unix.Setxattr(filepath.Join(up, "d/a"), xattrWhiteout, []byte("y"), 0))
	write(t, filepath.Join(up, "d/c"), "not empty, so not a whiteout", 0o644)
	must(t, unix.Setxattr(filepath.Join(up, "d/c"), xattrWhiteout, []byte("y"), 0))
	opaque(t, filepath.Join(up, "d"), "x")
	write(t, filepath.Join(up, "e/new"), "n", 0o644)
	opaque(t, filepath.Join(up, "e"), "y")
	opaque(t, up, "y")

	kernel := filepath.Join(dir, "kernel")
	mountOverlay(t, kernel, up, filepath.Join(dir, "W"), l)
	tgt := filepath.Join(dir, "target")
	mountOverlay(t, tgt, filepath.Join(dir, "U2"), filepath.Join(dir, "W2"), l)
	st, err := Apply(context.Background(), up, tgt)
	if err != nil {
		t.Fatal(err)
	}
	if st.Whiteouts != 1 || st.Opaques != 1 {
		t.Fatalf("stats %+v: want 1 whiteout, 1 opaque", st)
	}
	for _, p := range []string{"rootfile", "d/a", "d/b", "d/c", "e/gone", "e/new"} {
		_, kerr := os.Lstat(filepath.Join(kernel, p))
		_, aerr := os.Lstat(filepath.Join(tgt, p))
		if (kerr == nil) != (aerr == nil) {
			t.Errorf("%s: kernel view %v, applied %v", p, kerr, aerr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(tgt, "d/c")); string(b) != "not empty, so not a whiteout" {
		t.Errorf("d/c = %q", b)
	}
}

func TestApplyRejects(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for _, n := range []string{"", ".", "..", "a/b", "a\x00"} {
		if validName(n) {
			t.Errorf("validName(%q) = true", n)
		}
	}
	mk := func(t *testing.T) (string, string) {
		dir := t.TempDir()
		up, tgt := filepath.Join(dir, "upper"), filepath.Join(dir, "target")
		must(t, os.Mkdir(up, 0o755))
		must(t, os.Mkdir(tgt, 0o755))
		return up, tgt
	}
	t.Run("metacopy", func(t *testing.T) {
		up, tgt := mk(t)
		write(t, filepath.Join(up, "f"), "", 0o644)
		must(t, unix.Setxattr(filepath.Join(up, "f"), xattrMetacopy, nil, 0))
		if _, err := Apply(ctx, up, tgt); !errdefs.IsNotImplemented(err) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("redirect", func(t *testing.T) {
		up, tgt := mk(t)
		must(t, os.Mkdir(filepath.Join(up, "d"), 0o755))
		must(t, unix.Setxattr(filepath.Join(up, "d"), xattrRedirect, []byte("/elsewhere"), 0))
		if _, err := Apply(ctx, up, tgt); !errdefs.IsNotImplemented(err) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("too many entries", func(t *testing.T) {
		up, tgt := mk(t)
		for i := range 10 {
			write(t, filepath.Join(up, strconv.Itoa(i)), "x", 0o644)
		}
		if _, err := Apply(ctx, up, tgt, WithMaxEntries(5)); !errdefs.IsResourceExhausted(err) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		up, tgt := mk(t)
		write(t, filepath.Join(up, "f"), "x", 0o644)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := Apply(cctx, up, tgt); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
		if _, err := os.Lstat(filepath.Join(tgt, "f")); !os.IsNotExist(err) {
			t.Fatal("a canceled Apply still wrote")
		}
	})
	t.Run("missing target", func(t *testing.T) {
		up, tgt := mk(t)
		if _, err := Apply(ctx, up, tgt+"-nope"); !errdefs.IsNotFound(err) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("target is a symlink", func(t *testing.T) {
		up, tgt := mk(t)
		link := tgt + "-link"
		must(t, os.Symlink(tgt, link))
		if _, err := Apply(ctx, up, link); err == nil {
			t.Fatal("Apply followed a symlinked target root")
		}
	})
}

// TestAdversarialSwapAtCheck swaps an entry for a symlink to outside in the
// exact window between Apply's checks and its open, on both sides: the open
// must refuse (invalid argument), never follow.
func TestAdversarialSwapAtCheck(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct{ side, rel, link string }{
		{"target", "d", "victim"},
		{"upper", "d", "victim"},
		{"upper", "d/f", "secret"},
	} {
		t.Run(tc.side+"/"+tc.rel, func(t *testing.T) {
			dir := t.TempDir()
			outside := filepath.Join(dir, "outside")
			g := newGuard(t, outside)
			up, tgt := filepath.Join(dir, "upper"), filepath.Join(dir, "target")
			write(t, filepath.Join(up, "d/f"), "data", 0o644)
			must(t, os.MkdirAll(filepath.Join(tgt, "d"), 0o755))
			root := map[string]string{"upper": up, "target": tgt}[tc.side]
			swapped := false
			hook := func(side, rel string) {
				if side != tc.side || rel != tc.rel || swapped {
					return
				}
				swapped = true
				p := filepath.Join(root, rel)
				must(t, os.Rename(p, p+".moved"))
				must(t, os.Symlink(filepath.Join(outside, tc.link), p))
			}
			_, err := Apply(context.Background(), up, tgt, func(o *options) { o.beforeOpen = hook })
			if !swapped {
				t.Fatal("the hook never ran")
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("want invalid argument after the swap, got %v", err)
			}
			checkNoSecret(t, tgt)
			g.check(t)
		})
	}
}
