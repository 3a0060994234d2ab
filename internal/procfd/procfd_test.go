//go:build linux

package procfd

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mountOf is the id of the mount path is on.
func mountOf(t *testing.T, path string) uint64 {
	t.Helper()
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil {
		t.Fatal(err)
	}
	return stx.Mnt_id
}

func has(ws []Writer, pid int, path string) bool {
	for _, w := range ws {
		if w.Pid == pid && w.Path == path {
			return true
		}
	}
	return false
}

func TestWriters(t *testing.T) {
	dir := t.TempDir()
	wpath := filepath.Join(dir, "written")
	rpath := filepath.Join(dir, "read")
	w, err := os.Create(wpath)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := os.WriteFile(rpath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(rpath)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	mounts := Mounts{mountOf(t, dir): true}
	self := os.Getpid()

	ws := Writers(mounts, 0)
	if !has(ws, self, wpath) {
		t.Fatalf("Writers = %+v, want pid %d writing %s", ws, self, wpath)
	}
	if has(ws, self, rpath) {
		t.Fatalf("Writers = %+v names %s, open read-only", ws, rpath)
	}
	for _, x := range ws {
		if x.Pid == self && x.Command == "" {
			t.Fatalf("writer %+v has no command", x)
		}
	}
	if ws := WritersAmong([]int{self}, mounts, 1); !has(ws, self, wpath) {
		t.Fatalf("WritersAmong(self) = %+v", ws)
	}
	if !AnyWriterAmong([]int{self}, mounts) {
		t.Fatal("AnyWriterAmong(self) = false with a file open for writing")
	}
	if AnyWriterAmong([]int{self}, Mounts{^uint64(0): true}) {
		t.Fatal("AnyWriterAmong found a writer on a mount that does not exist")
	}
	if AnyWriterAmong(nil, mounts) || len(WritersAmong(nil, mounts, 0)) != 0 {
		t.Fatal("no processes, yet a writer")
	}
	if len(Writers(nil, 0)) != 0 {
		t.Fatal("no mounts, yet a writer")
	}
	w.Close()
	if has(WritersAmong([]int{self}, mounts, 0), self, wpath) {
		t.Fatal("a closed file is still a writer")
	}
}

func TestMappedWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mapped")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	// The mapping keeps the file open for writing once its descriptor is
	// closed: only the maps show it.
	f.Close()
	if has(WritersAmong([]int{os.Getpid()}, Mounts{mountOf(t, path): true}, 0), os.Getpid(), path) {
		t.Fatal("a closed descriptor is still a writer")
	}
	ws := MappedWriters(int(unix.Major(st.Dev)), int(unix.Minor(st.Dev)), 0)
	if !has(ws, os.Getpid(), path+" (mapped)") {
		t.Fatalf("MappedWriters = %+v, want pid %d mapping %s", ws, os.Getpid(), path)
	}
	if ino := MappedInodes(int(unix.Major(st.Dev)), int(unix.Minor(st.Dev))); !ino[st.Ino] {
		t.Fatalf("MappedInodes = %v, want inode %d among them", ino, st.Ino)
	}
	if ws := MappedWriters(int(unix.Major(st.Dev)), int(unix.Minor(st.Dev)), 1); len(ws) != 1 {
		t.Fatalf("MappedWriters with limit 1 = %+v", ws)
	}
}

func TestRootMounts(t *testing.T) {
	ids, err := RootMounts(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !ids[mountOf(t, "/")] {
		t.Fatalf("RootMounts = %v lacks the mount of /", ids)
	}
	if _, err := RootMounts(-1); err == nil {
		t.Fatal("RootMounts of no process succeeded")
	}
}

func TestParseFdinfo(t *testing.T) {
	for _, c := range []struct {
		in    string
		flags int
		mnt   uint64
		ok    bool
	}{
		{"pos:\t0\nflags:\t0100002\nmnt_id:\t29\nino:\t5\n", 0o100002, 29, true},
		{"pos:\t0\nflags:\t02\n", 0, 0, false},
		{"flags:\tzz\nmnt_id:\t3\n", 0, 0, false},
		{"", 0, 0, false},
	} {
		flags, mnt, ok := parseFdinfo([]byte(c.in))
		if flags != c.flags || mnt != c.mnt || ok != c.ok {
			t.Errorf("parseFdinfo(%q) = %o, %d, %v; want %o, %d, %v", c.in, flags, mnt, ok, c.flags, c.mnt, c.ok)
		}
	}
}
