//go:build linux

package snapshotter

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// readySpares waits for the background making of spares to reach n.
func readySpares(t *testing.T, s *Snapshotter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.spares.mu.Lock()
		got := len(s.spares.ready)
		s.spares.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spare layers ready after 10s, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func entries(t *testing.T, dir string) int {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestForkTakesSpareLayers: after a first fork, forks take their layers
// from the spares, the layers are what a fork makes itself (owner of the
// parent's upper, modes, usable as an overlay), and a restart removes the
// spares left.
func TestForkTakesSpareLayers(t *testing.T) {
	requireRoot(t)
	ctx, dir := t.Context(), t.TempDir()
	s, err := New(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	sb := newSandbox(t, ctx, s, "ns/1/sandbox")
	// A parent owned by someone else than the snapshotter: a spare (owned
	// by the snapshotter) must be given to that owner.
	rootID := s.mustID(t, ctx, sb.key)
	if err := os.Lchown(s.upperPath(rootID), 1234, 4321); err != nil {
		t.Fatal(err)
	}
	spares := filepath.Join(dir, spareDir)
	if n := entries(t, spares); n != 0 {
		t.Fatalf("%d spares before the first fork", n)
	}
	first, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	readySpares(t, s, spareTarget)
	if n := entries(t, spares); n != spareTarget {
		t.Fatalf("%d spare directories, want %d", n, spareTarget)
	}
	kids, err := s.Fork(ctx, sb.ctx(first[0].ID), 3)
	if err != nil {
		t.Fatal(err)
	}
	// Taken: three fewer on disk until the refill, which starts after the
	// fork, puts them back.
	readySpares(t, s, spareTarget)
	for _, k := range append(first, kids...) {
		layer := s.branchDir(rootID, k.ID)
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(layer, "fs"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 1234 || st.Gid != 4321 || st.Mode&0o7777 != 0o755 {
			t.Fatalf("branch %s upper: owner %d:%d mode %o, want 1234:4321 755", k.ID, st.Uid, st.Gid, st.Mode&0o7777)
		}
		if err := unix.Lstat(filepath.Join(layer, "work"), &st); err != nil || st.Mode&0o7777 != 0o711 {
			t.Fatalf("branch %s work directory: mode %o, %v", k.ID, st.Mode&0o7777, err)
		}
	}
	m := mountAt(t, kids[2].Mounts)
	writeFile(t, filepath.Join(m, "new"), "in a spare\n")
	if got := readFile(t, filepath.Join(s.contextUpper(rootID, kids[2].ID), "new")); got != "in a spare\n" {
		t.Fatalf("upper of the branch holds %q", got)
	}
	if got := readFile(t, filepath.Join(m, "app", "main.txt")); got != "version 1\n" {
		t.Fatalf("branch reads %q from its base", got)
	}

	err = s.Close()
	s = nil
	if err != nil {
		t.Fatal(err)
	}
	if n := entries(t, spares); n == 0 {
		t.Fatal("no spares on disk after Close; the restart check below proves nothing")
	}
	if s, err = New(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if n := entries(t, spares); n != 0 {
		t.Fatalf("%d spares left after a restart", n)
	}
}
