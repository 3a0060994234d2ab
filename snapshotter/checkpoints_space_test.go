//go:build linux

package snapshotter

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/internal/fstest"
)

// sandboxOnExt4 is a snapshotter on an ext4 filesystem of sizeMB (its
// mount point mnt) and a sandbox of it, mounted at live.
func sandboxOnExt4(t *testing.T, ctx context.Context, sizeMB int) (mnt string, s *Snapshotter, sb sandbox, live string) {
	t.Helper()
	mnt = loopExt4(t, sizeMB)
	s, err := New(ctx, filepath.Join(mnt, "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sb = newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	return mnt, s, sb, mountAt(t, rm)
}

// TestRollbackOutOfSpace: a rollback whose checkpoint's version of the
// changed files does not fit in the space free is refused before it
// changes anything, as a commit is: the branch's files as they were, no
// rollback left pending (a rollback to another checkpoint is made), and
// once there is room the same rollback is made. Refused both where the
// checkpoint's version of the files does not fit and where their apply
// beside it does not.
func TestRollbackOutOfSpace(t *testing.T) {
	ctx := context.Background()
	mnt, s, sb, live := sandboxOnExt4(t, ctx, 192)
	for i := range 4 {
		if err := os.WriteFile(filepath.Join(live, "f"+strconv.Itoa(i)), bytes.Repeat([]byte{byte('a' + i)}, 8<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "a"); err != nil {
		t.Fatal(err)
	}
	want := scan(t, live)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "spare"); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := os.WriteFile(filepath.Join(live, "f"+strconv.Itoa(i)), bytes.Repeat([]byte{'z'}, 8<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	changed := scan(t, live)
	// Room for neither the checkpoint's version of the files (32 MiB,
	// gathered first) nor their apply; then for the first but not both.
	for i, leave := range []int64{12 << 20, 44 << 20} {
		filler := filepath.Join(mnt, "filler"+strconv.Itoa(i))
		if err := fill(filler, leave); err != nil {
			t.Fatal(err)
		}
		err := s.Rollback(ctx, sb.ctx(""), "a")
		t.Logf("rollback with %d MiB free: %v", leave>>20, err)
		if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "nothing changed") {
			t.Fatalf("rollback that does not fit: %v; want resource exhausted, nothing changed", err)
		}
		if i == 1 && !strings.Contains(err.Error(), "needs ") {
			t.Fatalf("rollback whose apply does not fit: %v; want the space it needs", err)
		}
		if diffs := fstest.DiffTrees(changed, scan(t, live)); len(diffs) > 0 {
			t.Fatalf("files changed by a refused rollback: %v", diffs)
		}
		if entries, _ := os.ReadDir(s.checkpointBase(mustRootID(t, ctx, s, sb))); len(entries) != 2 {
			t.Fatalf("checkpoint directory after a refused rollback: %v", entries)
		}
		removeAndSync(t, mnt, filler)
	}
	// Not left pending: a rollback to another checkpoint is made (one to
	// "a" pending would refuse it), then to "a" itself.
	if err := s.Rollback(ctx, sb.ctx(""), "spare"); err != nil {
		t.Fatalf("rollback to another checkpoint after the refusals: %v", err)
	}
	sameTree(t, "after the rollback to spare", want, live)
	if err := os.WriteFile(filepath.Join(live, "f0"), []byte("changed again"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Rollback(ctx, sb.ctx(""), "a"); err != nil {
		t.Fatalf("rollback once there is room: %v", err)
	}
	sameTree(t, "after the rollback", want, live)
}

// TestCheckpointOutOfSpace: a checkpoint that does not fit fails with
// resource exhausted and keeps nothing (no layer, no record, its name
// free), and is made once there is room.
func TestCheckpointOutOfSpace(t *testing.T) {
	ctx := context.Background()
	mnt, s, sb, live := sandboxOnExt4(t, ctx, 96)
	if err := os.WriteFile(filepath.Join(live, "big"), bytes.Repeat([]byte{'b'}, 24<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(mnt, "filler")
	if err := fill(filler, 8<<20); err != nil {
		t.Fatal(err)
	}
	_, err := s.Checkpoint(ctx, sb.ctx(""), "c")
	t.Logf("checkpoint on a full disk: %v", err)
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("checkpoint that does not fit: %v; want resource exhausted", err)
	}
	if entries, _ := os.ReadDir(s.checkpointBase(mustRootID(t, ctx, s, sb))); len(entries) != 0 {
		t.Fatalf("checkpoint directory after a failed checkpoint: %v", entries)
	}
	if l, err := s.Checkpoints(ctx, sb.root); err != nil || len(l) != 0 {
		t.Fatalf("checkpoints after a failed one: %v %v", l, err)
	}
	removeAndSync(t, mnt, filler)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "c"); err != nil {
		t.Fatalf("checkpoint once there is room: %v", err)
	}
}
