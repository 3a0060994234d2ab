//go:build linux

package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

// A memory layer comes from a registry: only regular files directly
// under checkpoint/ are unpacked, and nothing outside dir is written.
func TestUnpackMemory(t *testing.T) {
	type entry struct {
		name string
		typ  byte
	}
	layer := func(es ...entry) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		for _, e := range es {
			h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o600}
			if e.typ == tar.TypeReg {
				h.Size = 3
			}
			if e.typ == tar.TypeSymlink {
				h.Linkname = "/etc/passwd"
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if e.typ == tar.TypeReg {
				if _, err := tw.Write([]byte("abc")); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for _, bad := range [][]entry{
		{{"../x", tar.TypeReg}},
		{{"checkpoint/../../x", tar.TypeReg}},
		{{"checkpoint/sub/x", tar.TypeReg}},
		{{"x", tar.TypeReg}},
		{{"checkpoint/link", tar.TypeSymlink}},
		{{"checkpoint/", tar.TypeDir}},
		{{"checkpoint/a.img", tar.TypeReg}, {"checkpoint/a.img", tar.TypeReg}},
	} {
		dir := t.TempDir()
		err := unpackMemory(bytes.NewReader(layer(bad...)), dir)
		if err == nil {
			t.Fatalf("%v unpacked; want refused", bad)
		}
		if bad[0].name != "checkpoint/a.img" && !errdefs.IsInvalidArgument(err) {
			t.Fatalf("%v: %v; want invalid argument", bad, err)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "x")); err == nil {
			t.Fatalf("%v wrote outside the directory", bad)
		}
	}
	dir := t.TempDir()
	if err := unpackMemory(bytes.NewReader(layer(entry{"checkpoint/pages-1.img", tar.TypeReg}, entry{"./checkpoint/core-1.img", tar.TypeReg})), dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"pages-1.img", "core-1.img"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || string(b) != "abc" {
			t.Fatalf("%s: %q %v", f, b, err)
		}
	}
}
