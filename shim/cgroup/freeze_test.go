//go:build linux

package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCgroupFrozen freezes real cgroups, on the v1 freezer and on the
// unified hierarchy (cgroup2's freeze needs no controller), and reads them
// as a paused sandbox's and as a branch below it.
func TestCgroupFrozen(t *testing.T) {
	ms, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("bbx-pause-test-%d", os.Getpid())
	tested := 0
	for _, m := range ms {
		if !m.Freezer && !m.V2 {
			continue
		}
		file, frozen, thawed := "freezer.state", "FROZEN", "THAWED"
		if m.V2 {
			file, frozen, thawed = "cgroup.freeze", "1", "0"
		}
		parent := filepath.Join(m.Path, name)
		child := filepath.Join(parent, "b1")
		if err := os.MkdirAll(child, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(parent, file), []byte(thawed), 0)
			_ = unix.Rmdir(child)
			if err := unix.Rmdir(parent); err != nil {
				t.Errorf("remove test cgroup %s: %v", parent, err)
			}
		})
		at := func(dir string) []Dir { d := m; d.Path = dir; return []Dir{d} }
		if Frozen(at(parent)) || Frozen(at(child)) {
			t.Errorf("%s: a new cgroup reads frozen", m.Path)
		}
		if err := os.WriteFile(filepath.Join(parent, file), []byte(frozen), 0); err != nil {
			t.Fatal(err)
		}
		if !Frozen(at(parent)) {
			t.Errorf("%s: a frozen cgroup does not read frozen", m.Path)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !Frozen(at(child)) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !Frozen(at(child)) {
			t.Errorf("%s: the child of a frozen cgroup does not read frozen", m.Path)
		}
		if err := os.WriteFile(filepath.Join(parent, file), []byte(thawed), 0); err != nil {
			t.Fatal(err)
		}
		if Frozen(at(parent)) {
			t.Errorf("%s: a thawed cgroup reads frozen", m.Path)
		}
		// A child frozen by itself does not make its parent read frozen:
		// a branch held for a commit is not a paused sandbox.
		if err := os.WriteFile(filepath.Join(child, file), []byte(frozen), 0); err != nil {
			t.Fatal(err)
		}
		if Frozen(at(parent)) {
			t.Errorf("%s: the parent of a frozen child reads frozen", m.Path)
		}
		_ = os.WriteFile(filepath.Join(child, file), []byte(thawed), 0)
		tested++
	}
	if tested == 0 {
		t.Skip("no freezer here (v1 freezer or cgroup2)")
	}
}
