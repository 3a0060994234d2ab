//go:build linux

package apply

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// baseTree is a lower with one of everything, for the changes to act on.
func baseTree(t testing.TB, l string) {
	t.Helper()
	write(t, filepath.Join(l, "keep"), "keep", 0o644)
	write(t, filepath.Join(l, "f1"), "one", 0o644)
	write(t, filepath.Join(l, "f2"), "two", 0o755)
	write(t, filepath.Join(l, "f3"), "three", 0o644)
	write(t, filepath.Join(l, "a/x"), "ax", 0o644)
	write(t, filepath.Join(l, "a/y"), "ay", 0o644)
	write(t, filepath.Join(l, "a/deep/z"), "z", 0o644)
	write(t, filepath.Join(l, "b/b1"), "b1", 0o644)
	write(t, filepath.Join(l, "b/sub/b2"), "b2", 0o644)
	write(t, filepath.Join(l, "c/old1"), "c1", 0o644)
	write(t, filepath.Join(l, "c/olddir/old2"), "c2", 0o644)
	write(t, filepath.Join(l, "tofile/inner"), "in", 0o644)
	write(t, filepath.Join(l, "todir"), "was a file", 0o644)
	write(t, filepath.Join(l, "tolink"), "was a file", 0o644)
	write(t, filepath.Join(l, "dirtolink/x"), "x", 0o644)
	must(t, os.Symlink("keep", filepath.Join(l, "linktodir")))
	must(t, os.Symlink("keep", filepath.Join(l, "oldlink")))
	write(t, filepath.Join(l, "lowerhl1"), "linked in lower", 0o644)
	must(t, os.Link(filepath.Join(l, "lowerhl1"), filepath.Join(l, "lowerhl2")))
	write(t, filepath.Join(l, "xattrs"), "x", 0o644)
	must(t, unix.Setxattr(filepath.Join(l, "xattrs"), "user.gone", []byte("1"), 0))
	must(t, unix.Setxattr(filepath.Join(l, "xattrs"), "user.stays", []byte("2"), 0))
	must(t, unix.Setxattr(filepath.Join(l, "a"), "user.dirattr", []byte("lower"), 0))
	f, err := os.Create(filepath.Join(l, "sparse"))
	must(t, err)
	_, err = f.WriteAt([]byte("tail"), 3<<20)
	must(t, err)
	must(t, f.Close())
}

func setTimes(t testing.TB, p string, sec int64) {
	t.Helper()
	ts := []unix.Timespec{{Sec: sec, Nsec: 1}, {Sec: sec, Nsec: 987654321}}
	must(t, unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW))
}

// TestApplyFilesDirsWhiteouts is the first oracle: new, changed and deleted
// files and directories, and a directory removed and made again (opaque).
func TestApplyFilesDirsWhiteouts(t *testing.T) {
	o := runOracle(t, baseTree, func(t testing.TB, m string) {
		write(t, filepath.Join(m, "new"), "new file", 0o640)
		write(t, filepath.Join(m, "f1"), "changed", 0o644)
		write(t, filepath.Join(m, "a/x"), "changed in dir", 0o600)
		write(t, filepath.Join(m, "newdir/sub/deep/file"), "deep", 0o644)
		must(t, os.Remove(filepath.Join(m, "f3")))
		must(t, os.Remove(filepath.Join(m, "a/y")))
		must(t, os.RemoveAll(filepath.Join(m, "b")))
		must(t, os.RemoveAll(filepath.Join(m, "c")))
		write(t, filepath.Join(m, "c/fresh"), "fresh", 0o644)
	})
	if o.stats.Whiteouts < 3 || o.stats.Opaques != 1 || o.stats.Files < 4 {
		t.Fatalf("stats %+v: want >=3 whiteouts, 1 opaque, >=4 files", o.stats)
	}
	// The old contents of the opaque directory must be gone.
	if _, err := os.Lstat(filepath.Join(o.Target, "c/old1")); !os.IsNotExist(err) {
		t.Fatalf("c/old1 survived an opaque directory: %v", err)
	}
}

// TestApplyAllKinds covers every kind of entry and attribute a commit carries.
func TestApplyAllKinds(t *testing.T) {
	o := runOracle(t, baseTree, func(t testing.TB, m string) {
		p := func(s string) string { return filepath.Join(m, s) }
		// Modes and owners, including setuid/setgid/sticky.
		write(t, p("suid"), "s", 0o755)
		must(t, unix.Chmod(p("suid"), 0o4755))
		write(t, p("sgid"), "s", 0o755)
		must(t, unix.Chmod(p("sgid"), 0o2711))
		must(t, os.Mkdir(p("sticky"), 0o755))
		must(t, unix.Chmod(p("sticky"), 0o1777))
		write(t, p("owned"), "o", 0o640)
		must(t, os.Lchown(p("owned"), 1000, 1001))
		must(t, unix.Chmod(p("f2"), 0o4750)) // copy-up of metadata only
		must(t, os.Lchown(p("keep"), 5, 6))
		// Symlinks, verbatim, including ones that point outside.
		must(t, os.Symlink("../../../../etc/passwd", p("escaping")))
		must(t, os.Symlink("/etc/shadow", p("absolute")))
		must(t, os.Symlink("dangling/nowhere", p("dangling")))
		must(t, os.Lchown(p("dangling"), 3, 4))
		must(t, os.Remove(p("oldlink")))
		must(t, os.Symlink("a/x", p("oldlink")))
		// Hard links: new ones across directories, and one to a lower file.
		write(t, p("hl/one"), "linked", 0o644)
		must(t, os.MkdirAll(p("hl2/deeper"), 0o755))
		must(t, os.Link(p("hl/one"), p("hl/two")))
		must(t, os.Link(p("hl/one"), p("hl2/deeper/three")))
		must(t, os.Link(p("a/deep/z"), p("zlink")))
		write(t, p("lowerhl1"), "one side of a lower link changed", 0o644)
		// Device nodes, fifos, sockets.
		must(t, unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		must(t, unix.Mknod(p("loop"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 0))))
		must(t, unix.Mkfifo(p("fifo"), 0o620))
		must(t, unix.Mknod(p("sock"), unix.S_IFSOCK|0o755, 0))
		// Xattrs, user and security, on files and directories.
		write(t, p("withx"), "x", 0o644)
		must(t, unix.Setxattr(p("withx"), "user.a", []byte("value a"), 0))
		must(t, unix.Setxattr(p("withx"), "security.bbtest", []byte("sec"), 0))
		must(t, unix.Removexattr(p("xattrs"), "user.gone"))
		must(t, unix.Setxattr(p("a"), "user.dirattr", []byte("upper"), 0))
		must(t, unix.Setxattr(p("sticky"), "user.d", []byte("dir"), 0))
		// Sparse files: new, and a lower one copied up and extended.
		f, err := os.Create(p("newsparse"))
		must(t, err)
		_, err = f.WriteAt([]byte("head"), 0)
		must(t, err)
		_, err = f.WriteAt([]byte("middle"), 5<<20)
		must(t, err)
		must(t, f.Truncate(9<<20))
		must(t, f.Close())
		f, err = os.OpenFile(p("sparse"), os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		_, err = f.Write([]byte("more"))
		must(t, err)
		must(t, f.Close())
		// Type changes.
		must(t, os.RemoveAll(p("tofile")))
		write(t, p("tofile"), "now a file", 0o644)
		must(t, os.Remove(p("todir")))
		write(t, p("todir/inner"), "now a dir", 0o644)
		must(t, os.Remove(p("tolink")))
		must(t, os.Symlink("keep", p("tolink")))
		must(t, os.RemoveAll(p("dirtolink")))
		must(t, os.Symlink("a", p("dirtolink")))
		must(t, os.Remove(p("linktodir")))
		write(t, p("linktodir/f"), "dir now", 0o644)
		// Deletions and an opaque directory.
		must(t, os.Remove(p("f3")))
		must(t, os.RemoveAll(p("b")))
		must(t, os.RemoveAll(p("c")))
		must(t, os.Mkdir(p("c"), 0o711))
		// Times last, on files, symlinks and directories.
		setTimes(t, p("withx"), 1000000000)
		setTimes(t, p("escaping"), 1100000000)
		setTimes(t, p("hl2/deeper"), 1200000000)
		setTimes(t, p("a"), 1300000000)
		setTimes(t, p("fifo"), 1400000000)
		must(t, os.Chmod(m, 0o750))
		setTimes(t, m, 1500000000)
	})
	st := o.stats
	if st.Hardlinks < 3 || st.Devices != 4 || st.Symlinks < 5 || st.Opaques < 1 || st.Whiteouts < 2 || st.Bytes == 0 {
		t.Fatalf("stats %+v do not show every kind", st)
	}
	// The comparator checked everything; spot-check what it rests on.
	var a, b unix.Stat_t
	must(t, unix.Lstat(filepath.Join(o.Target, "hl/one"), &a))
	must(t, unix.Lstat(filepath.Join(o.Target, "hl2/deeper/three"), &b))
	if a.Ino != b.Ino || a.Nlink != 3 {
		t.Fatalf("hard links not kept: ino %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if l, err := os.Readlink(filepath.Join(o.Target, "escaping")); err != nil || l != "../../../../etc/passwd" {
		t.Fatalf("escaping symlink: %q %v", l, err)
	}
}
