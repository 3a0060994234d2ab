package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSubdirs: Subdirs lists a cgroup and every one below it, parents
// first, on every hierarchy of the host; a leaf is itself alone (the link
// count shortcut) and a cgroup that is gone has none.
func TestSubdirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test makes cgroups and must run as root (make test does)")
	}
	ms, err := Mounts()
	if err != nil || len(ms) == 0 {
		t.Fatalf("cgroup hierarchies: %v %v", ms, err)
	}
	for _, m := range ms {
		top := filepath.Join(m.Path, fmt.Sprintf("bbx-subdirs-%d", os.Getpid()))
		want := []string{top, top + "/a", top + "/a/x", top + "/b"}
		for _, d := range want {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		got := Subdirs(top)
		leaf := Subdirs(top + "/b")
		for i := len(want) - 1; i >= 0; i-- {
			if err := os.Remove(want[i]); err != nil {
				t.Error(err)
			}
		}
		for i, d := range got {
			if d != top && !slices.Contains(got[:i], filepath.Dir(d)) {
				t.Errorf("%s: Subdirs = %v: %s comes before its parent", m.Path, got, d)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: Subdirs = %v, want %v", m.Path, got, want)
		}
		if !slices.Equal(leaf, []string{top + "/b"}) {
			t.Errorf("%s: Subdirs of a leaf = %v, want itself", m.Path, leaf)
		}
		if gone := Subdirs(top); gone != nil {
			t.Errorf("%s: Subdirs of a removed cgroup = %v, want none", m.Path, gone)
		}
	}
}
