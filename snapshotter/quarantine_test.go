//go:build linux

package snapshotter

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
)

// commitCrashingAt runs a commit of c that stops dead at fault point, as a
// SIGKILL there would: the decision is stored, mounts are in place, and
// nothing after the point runs. The part of a commit after its decision
// runs on a goroutine of its own; the hook ends that goroutine (its
// deferred unlocks run, as the kernel drops a dead daemon's locks) and
// cancels the caller, which would otherwise wait for it.
func commitCrashingAt(t *testing.T, ctx context.Context, s *Snapshotter, point string, c branch.Ref) {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fired atomic.Bool
	s.faultHook = func(p string) {
		if p == point {
			fired.Store(true)
			cancel()
			runtime.Goexit()
		}
	}
	_, _ = s.CommitBranch(cctx, c)
	s.commitWG.Wait()
	s.faultHook = nil
	if !fired.Load() {
		t.Fatalf("commit of %s did not reach fault point %s", c, point)
	}
}

// TestQuarantine: a tree whose recovery fails at start (a decided commit
// that cannot be applied, a record that cannot be decoded) is quarantined:
// the snapshotter starts, serves every other tree and every snapshot call,
// refuses the tree's branch operations naming the cause, shows the cause in
// the tree, and lifts the quarantine once a retry succeeds or the root
// snapshot is removed.
func TestQuarantine(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	sb := newSandbox(t, ctx, s, "sb")
	other := newSandbox(t, ctx, s, "other")
	rm, err := s.Mounts(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	parent := mountAt(t, rm)
	kids, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	k := mountAt(t, kids[0].Mounts)
	writeFile(t, filepath.Join(k, "d", "won"), "the winner's\n")
	sbID := s.mustID(t, ctx, sb.key)
	commitCrashingAt(t, ctx, s, FaultCommitDecided, sb.ctx(kids[0].ID))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true

	// While the daemon is down, the winner's layer gets what the apply
	// refuses: a redirect xattr (redirect_dir), so its commit cannot be
	// completed.
	upperD := filepath.Join(root, "branches", sbID, kids[0].ID, "fs", "d")
	if err := unix.Setxattr(upperD, "trusted.overlay.redirect", []byte("/elsewhere"), 0); err != nil {
		t.Fatal(err)
	}

	s, err = New(ctx, root)
	if err != nil {
		t.Fatalf("the snapshotter did not start with a tree it cannot recover: %v", err)
	}
	closed = false
	ti, err := s.Tree(ctx, sb.root)
	if err != nil {
		t.Fatalf("tree of a quarantined sandbox: %v", err)
	}
	if !strings.Contains(ti.Quarantine, "redirect") {
		t.Fatalf("tree does not show the cause of the quarantine: %q", ti.Quarantine)
	}
	for what, err := range map[string]error{
		"fork":  func() error { _, err := s.Fork(ctx, sb.ctx(""), 1); return err }(),
		"abort": func() error { _, err := s.Abort(ctx, sb.ctx(kids[1].ID)); return err }(),
		"commit": func() error {
			_, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID))
			return err
		}(),
		"checkpoint": func() error { _, err := s.Checkpoint(ctx, sb.ctx(""), "c1"); return err }(),
		"mounts":     func() error { _, err := s.BranchMounts(ctx, sb.ctx(kids[1].ID)); return err }(),
	} {
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "quarantined") || !strings.Contains(err.Error(), "redirect") {
			t.Errorf("%s on a quarantined tree: want failed precondition naming the quarantine and its cause, got %v", what, err)
		}
	}
	// The parent was not changed by the failed recovery.
	if _, err := os.Stat(filepath.Join(parent, "d", "won")); !os.IsNotExist(err) {
		t.Fatalf("the parent shows part of a commit that could not be completed: %v", err)
	}

	// Everything else is served.
	okids, err := s.Fork(ctx, other.ctx(""), 1)
	if err != nil {
		t.Fatalf("fork of another sandbox: %v", err)
	}
	if _, err := s.CommitBranch(ctx, other.ctx(okids[0].ID)); err != nil {
		t.Fatalf("commit in another sandbox: %v", err)
	}
	if _, err := s.Mounts(ctx, sb.key); err != nil {
		t.Fatalf("containerd's Mounts of the quarantined sandbox's snapshot: %v", err)
	}
	if _, err := s.Prepare(ctx, "fresh", ""); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if _, err := s.Reap(ctx); err != nil {
		t.Fatalf("reap with a quarantined tree: %v", err)
	}
	if _, err := os.Stat(upperD); err != nil {
		t.Fatalf("the reaper removed the winner's layer of a quarantined tree: %v", err)
	}

	// The cause removed, the next reap recovers the tree: the commit is
	// completed, through the parent's live mount.
	if err := unix.Removexattr(upperD, "trusted.overlay.redirect"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if ti, err = s.Tree(ctx, sb.root); err != nil || ti.Quarantine != "" {
		t.Fatalf("tree after a successful retry: quarantine %q, %v", ti.Quarantine, err)
	}
	if got := readFile(t, filepath.Join(parent, "d", "won")); got != "the winner's\n" {
		t.Fatalf("the recovered commit shows %q in the parent", got)
	}
	if _, err := s.Fork(ctx, sb.ctx(""), 1); err != nil {
		t.Fatalf("fork after the quarantine was lifted: %v", err)
	}

	// A record that cannot be decoded: the tree of "other" is garbled
	// while the daemon is down.
	otherID := s.mustID(t, ctx, other.key)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	db, err := bolt.Open(filepath.Join(root, branchDBName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return nestedBucket(tx, bucketBranchbox, bucketTrees).Put([]byte(otherID), []byte("{not json"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err = New(ctx, root)
	if err != nil {
		t.Fatalf("the snapshotter did not start with an undecodable tree: %v", err)
	}
	closed = false
	if ti, err := s.Tree(ctx, other.root); err != nil || !strings.Contains(ti.Quarantine, "decode") {
		t.Fatalf("tree of an undecodable record: quarantine %q, %v", ti.Quarantine, err)
	}
	if _, err := s.Fork(ctx, sb.ctx(""), 1); err != nil {
		t.Fatalf("fork of a sound tree beside an undecodable one: %v", err)
	}
	// Removing the sandbox's snapshot discards its tree and the quarantine.
	if err := s.Remove(ctx, other.key); err != nil {
		t.Fatalf("remove the snapshot of a quarantined tree: %v", err)
	}
	if c := s.quarantined.cause(otherID); c != nil {
		t.Fatalf("quarantine kept after its root snapshot was removed: %v", c)
	}
	if _, err := os.Stat(filepath.Join(root, "branches", otherID)); !os.IsNotExist(err) {
		t.Fatalf("layers of a removed quarantined tree left: %v", err)
	}
}
