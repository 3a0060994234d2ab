//go:build linux

package snapshotter

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/fstest"
)

// TestCheckpointSeesMappedWrites: a process that writes a file through a
// shared mapping (SQLite's -shm index, LMDB, any mmap'ed database) changes
// it without a write(2): the kernel updates the file's ctime only at the
// first write to a page after it was written back. A checkpoint or a
// rollback that went by ctime alone lost the second of two writes to one
// page: the next checkpoint did not copy it, and a rollback did not undo
// it. On tmpfs, which has no writeback, no mapped write changes the ctime
// at all: the same three checks failed with the snapshotter's root there
// (a node whose /var/lib is a tmpfs). Both for a file the sandbox made
// and for one of its image, copied up when opened for writing (its
// overlay inode number is then the image file's, not the upper's).
func TestCheckpointSeesMappedWrites(t *testing.T) {
	for _, fs := range []string{"default", "tmpfs"} {
		for _, file := range []string{"db", "app/main.txt"} {
			t.Run(fs+"/"+file, func(t *testing.T) {
				ctx, s := newTest(t)
				if fs == "tmpfs" {
					ctx, s = newTestOnTmpfs(t)
				}
				mappedWrites(t, ctx, s, file)
			})
		}
	}
}

// newTestOnTmpfs is newTest with the snapshotter's root on a tmpfs.
func newTestOnTmpfs(t *testing.T) (context.Context, *Snapshotter) {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	fstest.Tmpfs(t, dir, "size=64m")
	return newTestAt(t, dir)
}

func mappedWrites(t *testing.T, ctx context.Context, s *Snapshotter, file string) {
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	live := mountAt(t, rm)
	path := filepath.Join(live, file)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	// Older than a clock tick: not taken as possibly changed next time.
	time.Sleep(100 * time.Millisecond)

	m, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	m[0] = 'a' // the page dirty, the ctime now
	time.Sleep(100 * time.Millisecond)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "one"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	m[1] = 'b' // the same page: no ctime update unless it was written back

	time.Sleep(100 * time.Millisecond)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "two"); err != nil {
		t.Fatal(err)
	}
	startsWith(t, "checkpoint two", filepath.Join(mountCheckpoint(t, ctx, s, sb, "two"), file), "ab\x00")

	time.Sleep(100 * time.Millisecond)
	m[2] = 'c'
	time.Sleep(100 * time.Millisecond)
	if err := s.Rollback(ctx, sb.ctx(""), "two"); err != nil {
		t.Fatal(err)
	}
	startsWith(t, "after the rollback to two, the file", path, "ab\x00")
	if err := s.Rollback(ctx, sb.ctx(""), "one"); err != nil {
		t.Fatal(err)
	}
	startsWith(t, "after the rollback to one, the file", path, "a\x00\x00")
}

// startsWith fails the test unless the file at path starts with want.
func startsWith(t *testing.T, what, path, want string) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte(want)) {
		t.Errorf("%s holds %q, want %q", what, got[:min(len(got), len(want))], want)
	}
}
