//go:build linux

package cgroup

import (
	"os"
	"path/filepath"
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
