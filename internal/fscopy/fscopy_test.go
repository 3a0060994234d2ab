//go:build linux

package fscopy

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestData: every way of copying gives the same file, holes kept.
func TestData(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	head := bytes.Repeat([]byte("head"), 300_000)
	tail := bytes.Repeat([]byte("tail"), 1000)
	if _, err := f.WriteAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(tail, 8<<20); err != nil { // a hole between
		t.Fatal(err)
	}
	size := int64(8<<20 + len(tail) + 1<<20) // and a trailing hole
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want, _ := os.ReadFile(src)
	for how, c := range map[string]*Copier{"copy_file_range": {}, "sendfile": {noCFR: true}, "buffer": {noCFR: true, noSendfile: true}} {
		in, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, "dst")
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		copied, end, err := c.Data(int(in.Fd()), int(out.Fd()), size)
		if err == nil {
			err = out.Truncate(size)
		}
		in.Close()
		out.Close()
		if err != nil {
			t.Fatal(err)
		}
		// Extents are whole blocks; the trailing hole is left to the
		// caller's truncate.
		if end < 8<<20+int64(len(tail)) || end > 8<<20+1<<16 || copied < int64(len(head)+len(tail)) {
			t.Errorf("%s: copied %d bytes ending at %d", how, copied, end)
		}
		got, _ := os.ReadFile(dst)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the copy differs from the source", how)
		}
		var st unix.Stat_t
		if err := unix.Stat(dst, &st); err == nil && st.Blocks*512 >= size {
			t.Logf("%s: holes not kept (%d blocks; the filesystem may not keep them)", how, st.Blocks)
		}
	}
}
