//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// TestRootPathWithSpace: a node whose snapshotter root has a space in its
// path (the kernel lists an overlay's upper in the mount table with the
// space escaped, \040). Before, the live overlay of a branch was not found
// there: a fork sealed nothing, and the parent went on writing under its
// branches (the write below succeeded).
func TestRootPathWithSpace(t *testing.T) {
	ctx, s := newTestAt(t, filepath.Join(t.TempDir(), "node root"))
	sb := newSandbox(t, ctx, s, "ns/1/sandbox")
	rootMounts, err := s.Mounts(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	parent := mountAt(t, rootMounts)
	writeFile(t, filepath.Join(parent, "state"), "before fork\n")
	kids, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(parent, "state"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write to the sealed parent: got %v, want EROFS", err)
	}
	if _, err := s.Abort(ctx, sb.ctx(kids[1].ID)); err != nil {
		t.Fatal(err)
	}
	winner := mountAt(t, kids[0].Mounts)
	writeFile(t, filepath.Join(winner, "state"), "the winner's\n")
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(parent, "state")); got != "the winner's\n" {
		t.Fatalf("the parent's live mount reads %q after the commit", got)
	}
	writeFile(t, filepath.Join(parent, "state"), "after\n")
}

// TestRootPathRefused: a root whose path an overlay mount cannot name
// (its options are separated by commas, its layers by colons) is refused
// when the snapshotter starts, not at the first mount.
func TestRootPathRefused(t *testing.T) {
	requireRoot(t)
	for _, name := range []string{"a,b", "a:b", "a\nb"} {
		root := filepath.Join(t.TempDir(), name)
		s, err := New(context.Background(), root)
		if err == nil {
			s.Close()
			t.Errorf("root %q: started", root)
			continue
		}
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("root %q: %v, want invalid argument", root, err)
		}
		if _, err := os.Stat(root); err == nil {
			t.Errorf("root %q: made", root)
		}
	}
}
