//go:build linux

package ocirt

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTar writes a tar of the headers (a regular file's content is its
// name repeated to its size) to a file in dir.
func writeTar(t *testing.T, dir string, hs ...*tar.Header) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hs {
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bytes.Repeat([]byte{'x'}, int(h.Size))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "a.tar")
	if err := os.WriteFile(f, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestExtractTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
	dir := t.TempDir()
	file := writeTar(t, t.TempDir(),
		&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o1777},
		&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o750, Uid: 7, Gid: 8},
		&tar.Header{Typeflag: tar.TypeReg, Name: "d/f", Mode: 0o4755, Size: 3, Uid: 7},
		&tar.Header{Typeflag: tar.TypeLink, Name: "d/g", Linkname: "d/f"},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/etc"},
		&tar.Header{Typeflag: tar.TypeFifo, Name: "p", Mode: 0o600},
	)
	if err := extractTmpfs(file, dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "d", "f"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 || fi.Size() != 3 {
		t.Fatalf("d/f: %v %v", fi, err)
	}
	if g, _ := os.Stat(filepath.Join(dir, "d", "g")); !os.SameFile(fi, g) {
		t.Fatal("d/g is not a hard link of d/f")
	}
	if l, _ := os.Readlink(filepath.Join(dir, "l")); l != "/etc" {
		t.Fatalf("l -> %q", l)
	}
	if root, _ := os.Stat(dir); root.Mode()&os.ModeSticky == 0 {
		t.Fatalf("the root's mode %v, want the archive's (sticky)", root.Mode())
	}
	if d, _ := os.Stat(filepath.Join(dir, "d")); !d.ModTime().Equal(time.Unix(1700000000, 0)) {
		t.Fatalf("d's mtime %v, want the archive's", d.ModTime())
	}
}

// TestExtractTmpfsUntrusted: an archive (a pulled image's) cannot write
// outside the directory, through a symlink it made, or more than a copied
// tmpfs holds.
func TestExtractTmpfsUntrusted(t *testing.T) {
	for name, hs := range map[string][]*tar.Header{
		"through a symlink": {
			{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "OUT"},
			{Typeflag: tar.TypeReg, Name: "l/f", Size: 1},
		},
		"a hard link out": {
			{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "OUT"},
			{Typeflag: tar.TypeLink, Name: "h", Linkname: "l/secret"},
		},
		"too big": {
			{Typeflag: tar.TypeReg, Name: "f", Size: tmpfsCopyBytes + 1},
		},
	} {
		t.Run(name, func(t *testing.T) {
			out := t.TempDir()
			if err := os.WriteFile(filepath.Join(out, "secret"), []byte("s"), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, h := range hs {
				h.Linkname = strings.ReplaceAll(h.Linkname, "OUT", out)
				h.Mode = 0o644
			}
			dir := t.TempDir()
			if err := extractTmpfs(writeTar(t, t.TempDir(), hs...), dir); err == nil {
				t.Fatal("extracted")
			}
			if entries, _ := os.ReadDir(out); len(entries) != 1 {
				t.Fatalf("wrote outside: %v", entries)
			}
		})
	}
	// "../x" names x inside the directory.
	dir := t.TempDir()
	if err := extractTmpfs(writeTar(t, t.TempDir(), &tar.Header{Typeflag: tar.TypeReg, Name: "../x", Size: 1, Mode: 0o644}), dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err != nil {
		t.Fatal(err)
	}
}
