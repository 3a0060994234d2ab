//go:build linux

package apply

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

var (
	fuzzNames    = []string{"d", "e", "f", "..a", " ", "x.y", TempPrefix + "1", "\xff"}
	fuzzSymlinks = []string{"/", "..", "../..", "../outside/victim", "../../outside/secret", "d", "/proc/self/root", "d/../../..", "f"}
)

// fuzzSide builds one tree from fuzz bytes, keeping track of its dirs and
// regular files so later operations can act on them.
type fuzzSide struct {
	root  string
	dirs  []string
	files []string
}

// create makes a regular file without following a symlink or blocking on a
// fifo already at p: the builder itself must not write outside.
func create(p string, data []byte, off int64) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return unix.EINVAL
	}
	_, err = unix.Pwrite(fd, data, off)
	return err
}

func (s *fuzzSide) op(code, a, b byte) {
	dir := s.dirs[int(a)%len(s.dirs)]
	p := filepath.Join(s.root, dir, fuzzNames[int(b)%len(fuzzNames)])
	switch code % 13 {
	case 0:
		if create(p, bytes.Repeat([]byte{b}, int(a)), 0) == nil {
			s.files = append(s.files, p)
		}
	case 1:
		if os.Mkdir(p, 0o755) == nil {
			rel, _ := filepath.Rel(s.root, p)
			s.dirs = append(s.dirs, rel)
		}
	case 2:
		_ = os.Symlink(fuzzSymlinks[int(a)%len(fuzzSymlinks)], p)
	case 3:
		_ = unix.Mknod(p, unix.S_IFCHR, 0)
	case 4:
		if create(p, nil, 0) == nil {
			_ = unix.Lsetxattr(p, xattrWhiteout, []byte("y"), 0)
		}
	case 5:
		_ = unix.Lsetxattr(filepath.Join(s.root, dir), xattrOpaque, []byte("y"), 0)
	case 6:
		_ = unix.Lsetxattr(filepath.Join(s.root, dir), xattrOpaque, []byte("x"), 0)
	case 7:
		if len(s.files) > 0 {
			_ = os.Link(s.files[int(a)%len(s.files)], p)
		}
	case 8:
		_ = unix.Mkfifo(p, 0o644)
	case 9:
		if create(p, []byte{b}, int64(a)<<14) == nil {
			s.files = append(s.files, p)
		}
	case 10:
		_ = unix.Lsetxattr(p, "user.f", []byte{a, b}, 0)
	case 11:
		_ = unix.Fchmodat(unix.AT_FDCWD, p, uint32(a)<<4|uint32(b)&0o7, unix.AT_SYMLINK_NOFOLLOW)
	case 12:
		// Deepen: a chain of directories under a random one (never through
		// a symlink the input planted).
		if fi, err := os.Lstat(p); err == nil && !fi.IsDir() {
			return
		}
		if os.Mkdir(p, 0o755) == nil {
			rel, _ := filepath.Rel(s.root, p)
			s.dirs = append(s.dirs, rel)
		}
		for i := 0; i < int(a)%16; i++ {
			p = filepath.Join(p, "d")
			if os.Mkdir(p, 0o755) != nil {
				break
			}
			rel, _ := filepath.Rel(s.root, p)
			s.dirs = append(s.dirs, rel)
		}
	}
}

// FuzzApply builds a random upper (with crafted whiteouts, opaque marks,
// escaping symlinks, hard links, deep chains) and a random target from the
// input, applies, and checks that nothing outside changed or was read, and
// that what did land matches upper.
func FuzzApply(f *testing.F) {
	requireRoot(f)
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 1, 1, 0, 2, 3, 1, 0, 1})
	f.Add([]byte{1, 0, 0, 3, 0, 0, 129, 0, 0, 130, 0, 2, 2, 3, 0})
	f.Add([]byte{1, 0, 0, 5, 1, 0, 0, 1, 5, 129, 0, 0, 129, 1, 2, 7, 2, 1, 2, 3, 4})
	f.Add([]byte{12, 15, 0, 0, 9, 4, 140, 12, 0, 131, 3, 0, 4, 2, 1, 6, 0, 0})
	f.Add([]byte("\x01\x00\x00\x81\x00\x00\x02\x04\x00\x82\x01\x00\x09\x30\x02\x0a\x01\x02\x0b\x44\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 3*200 {
			data = data[:3*200]
		}
		dir := t.TempDir()
		g := newGuard(t, filepath.Join(dir, "outside"))
		up := &fuzzSide{root: filepath.Join(dir, "upper"), dirs: []string{""}}
		tgt := &fuzzSide{root: filepath.Join(dir, "target"), dirs: []string{""}}
		must(t, os.Mkdir(up.root, 0o755))
		must(t, os.Mkdir(tgt.root, 0o755))
		for i := 0; i+2 < len(data); i += 3 {
			// The top bit of the opcode picks the side.
			side := up
			if data[i]&0x80 != 0 {
				side = tgt
			}
			side.op(data[i]&0x7f, data[i+1], data[i+2])
		}
		_, err := Apply(context.Background(), up.root, tgt.root)
		checkNoSecret(t, tgt.root)
		g.check(t)
		if err != nil {
			return
		}
		checkLanded(t, up.root, tgt.root)
	})
}

// checkLanded verifies a successful Apply against upper: whiteouts are
// absent, files have upper's content, symlinks its text, directories are
// directories, and no temporary name is left.
func checkLanded(t *testing.T, up, tgt string) {
	t.Helper()
	err := filepath.WalkDir(up, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(up, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		tp := filepath.Join(tgt, rel)
		var tst unix.Stat_t
		terr := unix.Lstat(tp, &tst)
		isWhiteout := st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size == 0 {
			if _, err := unix.Lgetxattr(p, xattrWhiteout, nil); err == nil {
				isWhiteout = true
			}
		}
		switch {
		case isWhiteout:
			if terr == nil {
				t.Fatalf("%s: whiteout in upper but present in target", rel)
			}
		case terr != nil:
			t.Fatalf("%s: in upper, missing in target: %v", rel, terr)
		case st.Mode&unix.S_IFMT != tst.Mode&unix.S_IFMT:
			t.Fatalf("%s: type %#o in upper, %#o in target", rel, st.Mode&unix.S_IFMT, tst.Mode&unix.S_IFMT)
		case st.Mode&0o7777 != tst.Mode&0o7777 && st.Mode&unix.S_IFMT != unix.S_IFLNK:
			t.Fatalf("%s: mode %#o in upper, %#o in target", rel, st.Mode&0o7777, tst.Mode&0o7777)
		case st.Mode&unix.S_IFMT == unix.S_IFREG:
			a, err1 := os.ReadFile(p)
			b, err2 := os.ReadFile(tp)
			if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
				t.Fatalf("%s: content differs (%v, %v)", rel, err1, err2)
			}
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(tp)
			if a != b {
				t.Fatalf("%s: symlink %q in upper, %q in target", rel, a, b)
			}
		}
		return nil
	})
	must(t, err)
	must(t, filepath.WalkDir(tgt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// This process's temporary names; others may be planted by the input.
		if strings.HasPrefix(d.Name(), TempPrefix+strconv.Itoa(os.Getpid())+"-") {
			rel, _ := filepath.Rel(tgt, p)
			t.Fatalf("temporary %s left in target", rel)
		}
		return nil
	}))
}
