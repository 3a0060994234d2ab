//go:build linux

package snapshotter

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// TestCheckpointBounds: a checkpoint past the bounds its caller gives is
// refused with the figures, and nothing of it is kept: no record, no
// layer, its number free for the next one. A deleted checkpoint's layer
// that a later one builds on still counts in the bytes.
func TestCheckpointBounds(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	live := mountAt(t, rm)
	rootID := mustRootID(t, ctx, s, sb)
	write := func(name string, size int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(live, name), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	layers := func() []string {
		t.Helper()
		entries, _ := os.ReadDir(s.checkpointBase(rootID))
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	refused := func(name string, bounds branch.CheckpointOpt) *branch.CheckpointBoundError {
		t.Helper()
		before := layers()
		_, err := s.Checkpoint(ctx, sb.ctx(""), name, bounds)
		var be *branch.CheckpointBoundError
		if !errors.As(err, &be) || !errdefs.IsResourceExhausted(err) {
			t.Fatalf("checkpoint %s: %v, want a CheckpointBoundError (resource exhausted)", name, err)
		}
		if got := layers(); strings.Join(got, ",") != strings.Join(before, ",") {
			t.Fatalf("refused checkpoint %s left layers %v (before: %v)", name, got, before)
		}
		l, err := s.Checkpoints(ctx, sb.root)
		if err != nil {
			t.Fatal(err)
		}
		for _, ck := range l {
			if ck.Name == name {
				t.Fatalf("refused checkpoint %s is listed", name)
			}
		}
		return be
	}

	count := branch.WithCheckpointBounds(2, 0)
	for _, name := range []string{"a", "b"} {
		write(name, 1000)
		if _, err := s.Checkpoint(ctx, sb.ctx(""), name, count); err != nil {
			t.Fatal(err)
		}
	}
	if be := refused("c", count); !be.OverCount() || be.Count != 2 || be.MaxCheckpoints != 2 {
		t.Fatalf("count refusal %+v", be)
	}
	held := func() (all int64, sizes map[string]int64) {
		t.Helper()
		l, err := s.Checkpoints(ctx, sb.root)
		if err != nil {
			t.Fatal(err)
		}
		sizes = map[string]int64{}
		for _, ck := range l {
			all += ck.Size
			sizes[ck.Name] = ck.Size
		}
		return all, sizes
	}
	_, sizes := held()
	deleted := sizes["a"]
	if deleted < 1000 {
		t.Fatalf("checkpoint a holds %d bytes, want at least its 1000-byte file", deleted)
	}
	// Deleting "a" makes room; "a"'s layer stays (b builds on it) and its
	// bytes are still held.
	if err := s.DeleteCheckpoint(ctx, sb.root, "a"); err != nil {
		t.Fatal(err)
	}
	write("c", 1000)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "c", count); err != nil {
		t.Fatal(err)
	}

	// Bytes: b and c, and a, deleted but built on. A 10,000-byte change is
	// written and measured, then refused; the figures say so. (A file
	// changed within two clock ticks of a checkpoint is copied again by
	// the next, so the new one may hold more than the 10,000 bytes.)
	named, _ := held()
	total := named + deleted
	write("big", 10000)
	be := refused("big", branch.WithCheckpointBounds(0, total+9999))
	if be.OverCount() || be.Bytes != total || be.DeletedBytes != deleted || be.NewBytes < 10000 || be.MaxBytes != total+9999 {
		t.Fatalf("bytes refusal %+v, want %d held (%d deleted), at least 10000 new, max %d", be, total, deleted, total+9999)
	}
	// Already at the most: refused before the change is copied.
	be = refused("big", branch.WithCheckpointBounds(0, total))
	if be.NewBytes != 0 || be.Bytes != total {
		t.Fatalf("bytes refusal before the copy %+v", be)
	}
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "big", branch.WithCheckpointBounds(0, total+1<<20)); err != nil {
		t.Fatalf("a checkpoint that fits: %v", err)
	}
	// Without bounds (a caller that gives none), nothing is refused.
	write("d", 10)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "d"); err != nil {
		t.Fatal(err)
	}
}
