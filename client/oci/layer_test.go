//go:build linux

package oci

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
)

func TestDiffDirs(t *testing.T) {
	ov := func(opts ...string) []mount.Mount {
		return []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}
	}
	image := []mount.Mount{{Type: "bind", Source: "/s/1/fs", Options: []string{"ro", "rbind"}}}
	for _, tc := range []struct {
		name         string
		lower, upper []mount.Mount
		want         []string
		ok           bool
	}{
		{"root over a one-layer image", image, ov("workdir=/s/9/work", "upperdir=/s/9/fs", "lowerdir=/s/1/fs"), []string{"/s/9/fs"}, true},
		{"branch over two layers", ov("lowerdir=/s/2/fs:/s/1/fs"), ov("upperdir=/b/3/fs", "lowerdir=/s/9/fs:/s/2/fs:/s/1/fs", "index=off"), []string{"/b/3/fs", "/s/9/fs"}, true},
		{"checkpoint over another", ov("lowerdir=/c/1/fs:/s/1/fs"), ov("lowerdir=/c/2/fs:/c/1/fs:/s/1/fs"), []string{"/c/2/fs"}, true},
		{"root after its checkpoints", ov("lowerdir=/c/2/fs:/c/1/fs:/s/1/fs"), ov("upperdir=/s/2/fs", "lowerdir=/s/1/fs"), []string{"/s/2/fs", "/c/2/fs", "/c/1/fs"}, true},
		{"same state", ov("lowerdir=/s/2/fs:/s/1/fs"), ov("lowerdir=/s/2/fs:/s/1/fs"), []string{}, true},
		{"nothing shared", ov("lowerdir=/s/2/fs:/s/1/fs"), ov("upperdir=/b/3/fs", "lowerdir=/s/2/fs:/s/7/fs"), nil, false},
		{"escaped colon", image, ov("upperdir=/u", `lowerdir=/a\:b:/s/1/fs`), nil, false},
		{"two mounts", image, append(ov("upperdir=/u", "lowerdir=/s/1/fs"), image...), nil, false},
		{"not overlay", image, []mount.Mount{{Type: "ext4", Source: "/dev/vdb"}}, nil, false},
	} {
		got, ok := diffDirs(tc.lower, tc.upper)
		if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: diffDirs = %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
}

// TestChangesIn runs changesIn on plain directories standing for the two
// merged trees and the directories stacked between them: what each
// state's tree holds decides, the directories only name the paths.
func TestChangesIn(t *testing.T) {
	tmp := t.TempDir()
	lower, upper := filepath.Join(tmp, "lower"), filepath.Join(tmp, "upper")
	d1, d2 := filepath.Join(tmp, "d1"), filepath.Join(tmp, "d2")
	mk := func(root string, paths ...string) {
		for _, p := range paths {
			full := filepath.Join(root, p)
			if p[len(p)-1] == '/' {
				if err := os.MkdirAll(full, 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte(p), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// lower: the state before.
	mk(lower, "bin/sh", "bin/true", "etc/passwd", "etc/hosts", "data/old/x", "keep/k", "usr/lib/a", "usr/lib/b", "cfg/a", "cfg/b", "cfg/c")
	// upper: the state after: /bin/true deleted, /etc replaced by a new
	// directory, /data/old deleted whole, /new added, /usr/lib/a changed.
	mk(upper, "bin/sh", "etc/only", "data/", "keep/k", "usr/lib/a", "usr/lib/b", "new/f", "cfg/a", "cfg/b", "cfg/c")
	// Named but the same as before: keep/k (same mtime, with
	// nanoseconds), cfg/b (same whole-second mtime and content). Changed:
	// cfg/a (same size and whole-second mtime, other content).
	if err := os.WriteFile(filepath.Join(upper, "cfg/a"), []byte("cfg/A"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tm := range []struct {
		p string
		t time.Time
	}{{"keep/k", time.Unix(1700000000, 123)}, {"cfg/a", time.Unix(1700000000, 0)}, {"cfg/b", time.Unix(1700000000, 0)}} {
		for _, root := range []string{lower, upper} {
			if err := os.Chtimes(filepath.Join(root, tm.p), tm.t, tm.t); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The stacked directories name what changed (whiteouts and opaque
	// directories show here as plain names), and one name made and
	// removed again (/tmpfile), and a file under a deleted directory.
	mk(d1, "bin/true", "etc/only", "data/old", "new/f", "tmpfile")
	mk(d2, "etc/passwd", "data/old/x", "usr/lib/a", "keep/k", "cfg/a", "cfg/b")
	got, err := changesIn(context.Background(), []string{d1, d2}, lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	// Directories of the same mode and owner are the same (their parents
	// are added by the tar writer).
	want := []change{
		{path: "/bin/true", deleted: true},
		{path: "/cfg/a"},
		{path: "/data/old", deleted: true},
		{path: "/etc/hosts", deleted: true}, {path: "/etc/only"}, {path: "/etc/passwd", deleted: true},
		{path: "/new"}, {path: "/new/f"},
		{path: "/usr/lib/a"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("changesIn =\n%v\nwant\n%v", got, want)
	}
}

// TestChangesInSymlinkedDir: a directory replaced by a symlink that
// points out of the tree (/a -> outside, where a b exists) while another
// layer names /a/b: nothing is looked up through the link, so nothing of
// outside gets into the layer; /a is the symlink, and what was under it
// goes with the replaced directory.
func TestChangesInSymlinkedDir(t *testing.T) {
	tmp := t.TempDir()
	lower, upper, outside := filepath.Join(tmp, "lower"), filepath.Join(tmp, "upper"), filepath.Join(tmp, "outside")
	d1, d2 := filepath.Join(tmp, "d1"), filepath.Join(tmp, "d2")
	for _, d := range []string{filepath.Join(lower, "a"), upper, outside, d1, filepath.Join(d2, "a")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(lower, "a", "b"), filepath.Join(outside, "b"), filepath.Join(d2, "a", "b")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{filepath.Join(upper, "a"), filepath.Join(d1, "a")} {
		if err := os.Symlink(outside, l); err != nil {
			t.Fatal(err)
		}
	}
	got, err := changesIn(context.Background(), []string{d1, d2}, lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	if want := []change{{path: "/a"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("changesIn = %v, want %v", got, want)
	}
}
