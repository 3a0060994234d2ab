//go:build linux

package cgroup

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestHierarchyReads reads the freeze and population files of v1 and v2
// as the kernel writes them, through each hierarchy's implementation.
func TestHierarchyReads(t *testing.T) {
	write := func(t *testing.T, files map[string]string) string {
		dir := t.TempDir()
		for f, s := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, tc := range []struct {
		name             string
		d                Dir
		files            map[string]string
		frozen, freezing bool
		populated, known bool
		freezes, atOnce  bool
	}{
		{"v1 frozen", Dir{Freezer: true}, map[string]string{"freezer.state": "FROZEN\n"}, true, true, false, false, true, false},
		{"v1 freezing", Dir{Freezer: true}, map[string]string{"freezer.state": "FREEZING\n"}, false, true, false, false, true, false},
		{"v1 thawed", Dir{Freezer: true}, map[string]string{"freezer.state": "THAWED\n"}, false, false, false, false, true, false},
		{"v1 pids", Dir{Pids: true}, map[string]string{}, false, false, false, false, false, false},
		{"v2 frozen", Dir{V2: true}, map[string]string{"cgroup.freeze": "1\n", "cgroup.events": "populated 1\nfrozen 1\n"}, true, true, true, true, true, true},
		{"v2 freezing", Dir{V2: true}, map[string]string{"cgroup.freeze": "1\n", "cgroup.events": "populated 1\nfrozen 0\n"}, false, true, true, true, true, true},
		{"v2 frozen by an ancestor", Dir{V2: true}, map[string]string{"cgroup.freeze": "0\n", "cgroup.events": "populated 0\nfrozen 1\n"}, true, true, false, true, true, true},
		{"v2 thawed", Dir{V2: true}, map[string]string{"cgroup.freeze": "0\n", "cgroup.events": "populated 1\nfrozen 0\n"}, false, false, true, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := write(t, tc.files)
			h := tc.d.hier()
			if got := h.freezes(); got != tc.freezes {
				t.Errorf("freezes = %v, want %v", got, tc.freezes)
			}
			if got := h.killsAtOnce(); got != tc.atOnce {
				t.Errorf("killsAtOnce = %v, want %v", got, tc.atOnce)
			}
			if !tc.freezes {
				return
			}
			if got, err := h.frozen(dir); err != nil || got != tc.frozen {
				t.Errorf("frozen = %v, %v; want %v", got, err, tc.frozen)
			}
			if got := h.freezing(dir); got != tc.freezing {
				t.Errorf("freezing = %v, want %v", got, tc.freezing)
			}
			if tc.d.V2 {
				return // cgroup.events is read only on cgroupfs (TestCgroupFrozen)
			}
			if p, known, err := h.populated(dir); err != nil || p != tc.populated || known != tc.known {
				t.Errorf("populated = %v, %v, %v; want %v, %v", p, known, err, tc.populated, tc.known)
			}
		})
	}
}

// TestReadDirs: the directories a branch's description reads are the
// processes' hierarchy (the freezer's, as OneHierarchy picks it) and the
// memory one, on a v1 node, hybrid or not; the unified one alone on v2.
func TestReadDirs(t *testing.T) {
	v1 := []Dir{{Path: "/c/cpu"}, {Path: "/c/memory", Memory: true}, {Path: "/c/freezer", Freezer: true}, {Path: "/c/pids", Pids: true}}
	hybrid := append(append([]Dir{}, v1...), Dir{Path: "/c/unified", V2: true})
	for _, c := range []struct {
		ms        []Dir
		procs     string
		readPaths []string
	}{
		{v1, "/c/freezer/sb/b1", []string{"/c/memory/sb/b1", "/c/freezer/sb/b1"}},
		{hybrid, "/c/freezer/sb/b1", []string{"/c/memory/sb/b1", "/c/freezer/sb/b1", "/c/unified/sb/b1"}},
		{[]Dir{{Path: "/c", V2: true, Pids: true}}, "/c/sb/b1", []string{"/c/sb/b1"}},
		{[]Dir{{Path: "/c/cpu"}, {Path: "/c/pids", Pids: true}}, "/c/cpu/sb/b1", []string{"/c/cpu/sb/b1"}},
	} {
		dirs := ReadDirs(c.ms, "sb/b1")
		var paths []string
		for _, d := range dirs {
			paths = append(paths, d.Path)
		}
		if got := OneHierarchy(dirs); len(got) != 1 || got[0].Path != c.procs || !slices.Equal(paths, c.readPaths) {
			t.Errorf("ReadDirs(%v): %v, processes from %v; want %v, processes from %s", c.ms, paths, got, c.readPaths, c.procs)
		}
	}
}
