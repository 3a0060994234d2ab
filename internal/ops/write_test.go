//go:build linux

package ops

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"golang.org/x/sys/unix"
)

func stat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func names(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range entries {
		n = append(n, e.Name())
	}
	return strings.Join(n, ",")
}

// A write cut short leaves the file as it was; a whole one replaces it
// (a new inode) with its owner and mode, set-id bits too, and leaves no
// temporary name behind.
func TestWriteFileWhole(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o750|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	before := stat(t, f)
	r := hostRoot(t, 0)
	cut := io.MultiReader(strings.NewReader("new new"), iotest.ErrReader(errors.New("the client left")))
	if _, err := WriteFile(r, f, cut, 0o644); err == nil || !strings.Contains(err.Error(), "the client left") {
		t.Fatalf("a write cut short: %v", err)
	}
	if b, _ := os.ReadFile(f); string(b) != "old" || names(t, dir) != "f" {
		t.Fatalf("after a write cut short: %q, directory %s", b, names(t, dir))
	}
	if n, err := WriteFile(r, f, strings.NewReader("new"), 0o644); err != nil || n != 3 {
		t.Fatalf("write: %d %v", n, err)
	}
	after := stat(t, f)
	if b, _ := os.ReadFile(f); string(b) != "new" || names(t, dir) != "f" {
		t.Fatalf("after a write: %q, directory %s", b, names(t, dir))
	}
	if after.Ino == before.Ino || after.Uid != 1234 || after.Gid != 5678 || after.Mode != before.Mode {
		t.Fatalf("after a write: inode %d (was %d), owner %d:%d, mode %o (was %o)", after.Ino, before.Ino, after.Uid, after.Gid, after.Mode, before.Mode)
	}
	if _, err := WriteFile(r, filepath.Join(dir, "none"), cut, 0o644); err == nil || names(t, dir) != "f" {
		t.Fatalf("a new file cut short: %v, directory %s", err, names(t, dir))
	}
}

// A file with another hard link, and one a symlink points to, are
// written in place: the other link and the symlink see the new content.
func TestWriteFileInPlace(t *testing.T) {
	dir := t.TempDir()
	f, link, sym := filepath.Join(dir, "f"), filepath.Join(dir, "link"), filepath.Join(dir, "sym")
	if err := os.WriteFile(f, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(f, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", sym); err != nil {
		t.Fatal(err)
	}
	r := hostRoot(t, 0)
	if _, err := WriteFile(r, link, strings.NewReader("by link"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f); string(b) != "by link" {
		t.Fatalf("the other link reads %q", b)
	}
	if _, err := WriteFile(r, sym, strings.NewReader("by symlink"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f); string(b) != "by symlink" {
		t.Fatalf("the symlink's target reads %q", b)
	}
	if fi, err := os.Lstat(sym); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symlink: %v %v", fi, err)
	}
}

// Where the filesystem has no O_TMPFILE the temporary file has a name,
// removed if the write is discarded, gone into the file's once published.
func TestNamedTemp(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tmp, err := namedTemp(d, "/f", 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(names(t, dir), ".bbx-put-") {
		t.Fatalf("directory %s", names(t, dir))
	}
	tmp.discard()
	if names(t, dir) != "" {
		t.Fatalf("after discard: directory %s", names(t, dir))
	}
	tmp, err = namedTemp(d, "/f", 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.f.WriteString("x"); err != nil {
		t.Fatal(err)
	}
	if err := tmp.publish("f"); err != nil {
		t.Fatal(err)
	}
	tmp.discard()
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "x" || names(t, dir) != "f" {
		t.Fatalf("after publish: %q, directory %s", b, names(t, dir))
	}
}
