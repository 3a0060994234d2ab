//go:build linux

package safeopen

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpenBeneath(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"out": outside, "in": "f", "abs": "/etc/passwd"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"f", true},
		{"d", true},
		{"d/../f", true},
		{"../" + filepath.Base(outside) + "/secret", false},
		{"/etc/passwd", false},
		{"out/secret", false},
		{"in", false},
		{"abs", false},
	} {
		fd, err := OpenBeneath(root, tc.name, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
		}
		if tc.ok != (err == nil) {
			t.Errorf("%q: %v, want ok %v", tc.name, err, tc.ok)
		}
		if !tc.ok && err != nil && !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.ELOOP) {
			t.Errorf("%q: %v, want EXDEV or ELOOP", tc.name, err)
		}
	}
}
