//go:build linux

package snapshotter

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestUsageChargesBranches: a sandbox's usage (what containerd's CRI
// reports to the kubelet as the container's writable layer) counts what
// its branches write and what its checkpoints keep, and stops counting a
// branch once it is aborted.
func TestUsageChargesBranches(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "ns/1/sandbox")
	before, err := s.Usage(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	kids, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	dir := mountAt(t, kids[0].Mounts)
	if err := os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte("x"), 4*mib), 0o644); err != nil {
		t.Fatal(err)
	}
	written, err := s.Usage(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	if written.Size < before.Size+4*mib || written.Inodes <= before.Inodes {
		t.Fatalf("usage %+v after a branch wrote 4 MiB, %+v before: the branch's layer is not counted", written, before)
	}
	if _, err := s.Checkpoint(ctx, sb.ctx(kids[0].ID), "c1"); err != nil {
		t.Fatal(err)
	}
	checkpointed, err := s.Usage(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	if checkpointed.Size < written.Size+4*mib {
		t.Fatalf("usage %+v after a checkpoint copied the branch's 4 MiB, %+v before: the checkpoint is not counted", checkpointed, written)
	}
	if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	// The layers go in the background, out of the sandbox's directories at once.
	var after int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		u, err := s.Usage(ctx, sb.key)
		if err != nil {
			t.Fatal(err)
		}
		if after = u.Size; after <= written.Size-4*mib || time.Now().After(deadline) {
			break
		}
	}
	if after > written.Size-4*mib {
		t.Fatalf("usage %d bytes after the branch and its checkpoint went, %d with them: still counted", after, checkpointed.Size)
	}
}

// TestTreeUsageWhileWritten: the tree's upper size of a branch whose
// processes create and remove files as it is read (a build's temporary
// files) is its size, not 0: continuity's DiskUsage failed on an entry
// removed while it walked, and the size was then left out.
func TestTreeUsageWhileWritten(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "ns/1/sandbox")
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	dir := mountAt(t, kids[0].Mounts)
	if err := os.WriteFile(filepath.Join(dir, "big"), bytes.Repeat([]byte("x"), mib), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := filepath.Join(dir, "tmp", strconv.Itoa(i%50))
			_ = os.MkdirAll(p, 0o755)
			_ = os.WriteFile(filepath.Join(p, "f"), []byte("t"), 0o644)
			_ = os.RemoveAll(p)
		}
	}()
	defer func() { close(stop); <-churned }()
	for round := 0; round < 200; round++ {
		info, err := s.Tree(ctx, sb.root)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range info.Nodes {
			if n.ID == kids[0].ID && n.UpperSize < mib {
				t.Fatalf("round %d: branch %s's upper size %d while it holds a 1 MiB file", round, n.ID, n.UpperSize)
			}
		}
	}
}
