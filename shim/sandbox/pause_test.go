//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLockWithin: a lock held too long is given up on, and the lock taken
// late is released, so that the mutex ends free.
func TestLockWithin(t *testing.T) {
	var mu sync.Mutex
	if !lockWithin(&mu, time.Second) {
		t.Fatal("a free mutex was not locked")
	}
	if lockWithin(&mu, 10*time.Millisecond) {
		t.Fatal("a held mutex was locked")
	}
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !mu.TryLock() {
		if time.Now().After(deadline) {
			t.Fatal("the lock a waiter gave up on stayed held")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStartsWait: a Pause waits for the process starts under way, and no
// longer than its deadline.
func TestStartsWait(t *testing.T) {
	var s starts
	if !s.wait(time.Now()) {
		t.Fatal("waited with no start under way")
	}
	s.add()
	s.add()
	if s.wait(time.Now().Add(10 * time.Millisecond)) {
		t.Fatal("a start under way was not waited for")
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		s.done()
		s.done()
	}()
	if !s.wait(time.Now().Add(5 * time.Second)) {
		t.Fatal("the starts' end was not seen")
	}
}

// TestCgroupFrozen freezes real cgroups, on the v1 freezer and on the
// unified hierarchy (cgroup2's freeze needs no controller), and reads them
// as a paused sandbox's and as a branch below it.
func TestCgroupFrozen(t *testing.T) {
	ms, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("bbx-pause-test-%d", os.Getpid())
	tested := 0
	for _, m := range ms {
		if !m.freezer && !m.v2 {
			continue
		}
		file, frozen, thawed := "freezer.state", "FROZEN", "THAWED"
		if m.v2 {
			file, frozen, thawed = "cgroup.freeze", "1", "0"
		}
		parent := filepath.Join(m.dir, name)
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
		at := func(dir string) []cgroupMount { d := m; d.dir = dir; return []cgroupMount{d} }
		if cgroupFrozen(at(parent)) || cgroupFrozen(at(child)) {
			t.Errorf("%s: a new cgroup reads frozen", m.dir)
		}
		if err := os.WriteFile(filepath.Join(parent, file), []byte(frozen), 0); err != nil {
			t.Fatal(err)
		}
		if !cgroupFrozen(at(parent)) {
			t.Errorf("%s: a frozen cgroup does not read frozen", m.dir)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !cgroupFrozen(at(child)) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !cgroupFrozen(at(child)) {
			t.Errorf("%s: the child of a frozen cgroup does not read frozen", m.dir)
		}
		if err := os.WriteFile(filepath.Join(parent, file), []byte(thawed), 0); err != nil {
			t.Fatal(err)
		}
		if cgroupFrozen(at(parent)) {
			t.Errorf("%s: a thawed cgroup reads frozen", m.dir)
		}
		// A child frozen by itself does not make its parent read frozen:
		// a branch held for a commit is not a paused sandbox.
		if err := os.WriteFile(filepath.Join(child, file), []byte(frozen), 0); err != nil {
			t.Fatal(err)
		}
		if cgroupFrozen(at(parent)) {
			t.Errorf("%s: the parent of a frozen child reads frozen", m.dir)
		}
		_ = os.WriteFile(filepath.Join(child, file), []byte(thawed), 0)
		tested++
	}
	if tested == 0 {
		t.Skip("no freezer here (v1 freezer or cgroup2)")
	}
}
