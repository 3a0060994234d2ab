//go:build linux

package snapshotter

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// TestFullDisk: a branch fills the filesystem of the snapshotter's root,
// space and inodes. A fork and a checkpoint are refused with resource
// exhausted, naming the root and not a directory in it, and leave nothing; the branch that
// filled the disk is aborted (before, its abort could not be recorded:
// the branch database grows with writes past its end); a checkpoint is
// deleted; and the other branch, committed at once after the abort, finds
// the room the aborted one held.
func TestFullDisk(t *testing.T) {
	ctx := context.Background()
	mnt, s, sb, live := sandboxOnExt4(t, ctx, 64)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "c1"); err != nil {
		t.Fatal(err)
	}
	kids, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	winner, filler := mountAt(t, kids[0].Mounts), mountAt(t, kids[1].Mounts)
	writeFile(t, filepath.Join(winner, "new.txt"), strings.Repeat("from the winner\n", 1<<14))
	if err := fill(filepath.Join(filler, "big"), 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(filler, "i"+strconv.Itoa(i)))
		if err != nil {
			break
		}
		f.Close()
	}
	before := treeStates(t, ctx, s, sb)
	branches := filepath.Join(s.Root(), "branches")
	dirsBefore := countEntries(t, branches)

	_, err = s.Fork(ctx, sb.ctx(kids[0].ID), 1)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "under "+s.Root()+" ") || strings.Contains(err.Error(), s.Root()+"/") {
		t.Fatalf("fork on a full disk: %v; want resource exhausted, naming the root and no directory in it", err)
	}
	_, err = s.Checkpoint(ctx, sb.ctx(kids[0].ID), "c2")
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "under "+s.Root()+" ") || strings.Contains(err.Error(), s.Root()+"/") {
		t.Fatalf("checkpoint on a full disk: %v; want resource exhausted, naming the root and no directory in it", err)
	}
	if got := treeStates(t, ctx, s, sb); got != before {
		t.Fatalf("a refused fork changed the tree:\n%s\nwant\n%s", got, before)
	}
	if got := countEntries(t, branches); got != dirsBefore {
		t.Fatalf("a refused fork left directories: %d entries under branches/, %d before", got, dirsBefore)
	}

	if _, err := s.Abort(ctx, sb.ctx(kids[1].ID)); err != nil {
		t.Fatalf("abort of the branch that filled the disk: %v", err)
	}
	if err := s.DeleteCheckpoint(ctx, sb.root, "c1"); err != nil {
		t.Fatalf("delete a checkpoint on a full disk: %v", err)
	}
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatalf("commit at once after the abort that made room: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(live, "new.txt")); err != nil || len(b) != 16<<14 {
		t.Fatalf("the winner's file in the sandbox: %d bytes, %v", len(b), err)
	}
	_ = mnt
}

func countEntries(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(string, os.DirEntry, error) error { n++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestForkTooDeepForOneMount: each level of branches is one more lower
// directory of an overlay mount, whose options the kernel takes in one
// page. A fork whose branches' mount could not be made is refused
// (resource exhausted, nothing made), before the depth bound of 256,
// where before it was made and its start failed with containerd's "mount
// options is too long". The deepest branch made mounts; one more layer
// does not, through containerd's own mount.
func TestForkTooDeepForOneMount(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	parent, depth := "", 0
	var last branch.Info
	for {
		kids, err := s.Fork(ctx, sb.ctx(parent), 1)
		if err != nil {
			if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "more than the kernel takes in one mount") {
				t.Fatalf("fork at depth %d: %v", depth+1, err)
			}
			break
		}
		last, parent = kids[0], kids[0].ID
		if depth++; depth > maxDepth {
			t.Fatalf("%d levels made, and no mount refused", depth)
		}
	}
	t.Logf("%d levels made", depth)
	if depth < 100 {
		t.Fatalf("refused at depth %d: too early", depth+1)
	}
	info, err := s.Tree(ctx, sb.root)
	if err != nil || len(info.Nodes) != depth+1 {
		t.Fatalf("tree after the refusal: %d nodes, %v; want %d", len(info.Nodes), err, depth+1)
	}
	mountAt(t, last.Mounts)
	deeper := append([]string(nil), last.Mounts[0].Options...)
	for i, o := range deeper {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			first, _, _ := strings.Cut(v, ":")
			deeper[i] = "lowerdir=" + first + ":" + v
		}
	}
	m := mount.Mount{Type: "overlay", Source: "overlay", Options: deeper}
	err = m.Mount(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("one more layer through containerd's mount: %v, want its options too long", err)
	}
}
