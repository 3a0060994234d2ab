//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/fstest"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// sandbox is a root snapshot on a one-layer base, like a container rootfs.
type sandbox struct {
	s    *Snapshotter
	key  string
	root branch.Root
}

func newSandbox(t *testing.T, ctx context.Context, s *Snapshotter, key string) sandbox {
	t.Helper()
	m, err := s.Prepare(ctx, key+"-base-active", "")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(m[0].Source, "etc", "base.conf"), "from the image\n")
	writeFile(t, filepath.Join(m[0].Source, "app", "main.txt"), "version 1\n")
	if err := s.Commit(ctx, key+"-base", key+"-base-active"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, key, key+"-base"); err != nil {
		t.Fatal(err)
	}
	return sandbox{s: s, key: key, root: branch.Root{Key: key}}
}

func (sb sandbox) ctx(b string) branch.Ref { return branch.Ref{Root: sb.root, Branch: b} }

// mountAt mounts a branch at a new directory and unmounts it at cleanup.
func mountAt(t *testing.T, m []mount.Mount) string {
	t.Helper()
	dir := t.TempDir()
	if err := mount.All(m, dir); err != nil {
		t.Fatalf("mount %v: %v", m, err)
	}
	t.Cleanup(func() {
		if err := mount.UnmountAll(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestForkExploreCommit(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "ns/1/sandbox")
	rootMounts, err := s.Mounts(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	parent := mountAt(t, rootMounts)
	writeFile(t, filepath.Join(parent, "work", "state"), "before fork\n")

	kids, err := s.Fork(ctx, sb.ctx(""), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 3 || kids[0].ID != "1" || kids[2].ID != "3" {
		t.Fatalf("fork returned %+v", kids)
	}
	// Sealed: the parent's running mount refuses writes.
	if err := os.WriteFile(filepath.Join(parent, "work", "state"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write to sealed parent: got %v, want EROFS", err)
	}
	if got := readFile(t, filepath.Join(parent, "work", "state")); got != "before fork\n" {
		t.Fatalf("parent reads %q while sealed", got)
	}
	// A new mount of the sealed root is read-only too.
	if m, _ := s.Mounts(ctx, sb.key); !strings.Contains(strings.Join(m[0].Options, ","), "ro") {
		t.Fatalf("mounts of a sealed root are writable: %v", m)
	}

	dirs := make([]string, 3)
	for i, k := range kids {
		dirs[i] = mountAt(t, k.Mounts)
		if got := readFile(t, filepath.Join(dirs[i], "work", "state")); got != "before fork\n" {
			t.Fatalf("child %s sees %q", k.ID, got)
		}
		writeFile(t, filepath.Join(dirs[i], "work", "attempt"), "attempt "+k.ID+"\n")
	}
	if err := os.Remove(filepath.Join(dirs[1], "app", "main.txt")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dirs[1], "work", "state"), "after fix\n")
	// Siblings do not see each other.
	if got := readFile(t, filepath.Join(dirs[0], "work", "attempt")); got != "attempt 1\n" {
		t.Fatalf("child 1 sees %q", got)
	}
	if _, err := os.Stat(filepath.Join(dirs[0], "app", "main.txt")); err != nil {
		t.Fatalf("child 1 lost a file child 2 deleted: %v", err)
	}

	res, err := s.CommitBranch(ctx, sb.ctx("2"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Plan.Epoch != 1 || strings.Join(res.Plan.Invalidated, ",") != "1,3" {
		t.Fatalf("commit plan %+v", res.Plan)
	}
	// The parent's live mount shows the commit at once and is writable again.
	if got := readFile(t, filepath.Join(parent, "work", "state")); got != "after fix\n" {
		t.Fatalf("parent reads %q after commit", got)
	}
	if got := readFile(t, filepath.Join(parent, "work", "attempt")); got != "attempt 2\n" {
		t.Fatalf("parent reads %q after commit", got)
	}
	if _, err := os.Stat(filepath.Join(parent, "app", "main.txt")); !os.IsNotExist(err) {
		t.Fatalf("deleted file still in parent: %v", err)
	}
	writeFile(t, filepath.Join(parent, "work", "after"), "writable again\n")

	for _, loser := range []string{"1", "3"} {
		_, err := s.CommitBranch(ctx, sb.ctx(loser))
		var se *branch.StaleError
		if !errors.As(err, &se) || se.Winner != "2" || se.WinnerEpoch != 1 || !errdefs.IsAborted(err) {
			t.Fatalf("commit of loser %s: got %v, want stale naming branch 2 epoch 1", loser, err)
		}
		if _, err := s.Fork(ctx, sb.ctx(loser), 1); !errdefs.IsAborted(err) {
			t.Fatalf("fork of loser %s: %v", loser, err)
		}
		if _, err := os.Stat(s.branchDir(sb.s.mustID(t, ctx, sb.key), loser)); !os.IsNotExist(err) {
			t.Fatalf("loser %s layer not discarded: %v", loser, err)
		}
	}
	tree, err := s.Tree(ctx, sb.root)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]branch.State{}
	for _, n := range tree.Nodes {
		states[n.ID] = n.State
	}
	want := map[string]branch.State{"0": branch.Live, "1": branch.Stale, "2": branch.Committed, "3": branch.Stale}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Fatalf("tree states %v, want %v", states, want)
	}
	if tree.Nodes[0].Epoch != 1 || tree.Nodes[0].Sealed {
		t.Fatalf("root after commit: %+v", tree.Nodes[0])
	}
}

func (s *Snapshotter) mustID(t *testing.T, ctx context.Context, key string) string {
	t.Helper()
	var id string
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		snap, err := getSnapshot(ctx, key)
		id = snap.ID
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestCommitIntoUnmountedParentAndAbort(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	kids, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	d := mountAt(t, kids[0].Mounts)
	writeFile(t, filepath.Join(d, "new"), "committed offline\n")
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	if got := readFile(t, filepath.Join(p, "new")); got != "committed offline\n" {
		t.Fatalf("parent has %q", got)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.root, "mnt")); len(entries) != 0 {
		t.Fatalf("temporary commit mounts left: %v", entries)
	}

	// Abort: the parent stays sealed until its last child ends.
	more, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("sealed parent writable: %v", err)
	}
	if _, err := s.Abort(ctx, sb.ctx(more[0].ID)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("parent unsealed while a child lives: %v", err)
	}
	if _, err := s.Abort(ctx, sb.ctx(more[1].ID)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); err != nil {
		t.Fatalf("parent still sealed after its last child ended: %v", err)
	}
	if _, err := s.Abort(ctx, sb.ctx(more[1].ID)); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("second abort: %v", err)
	}
}

// TestReadonlyRootStaysReadonly: a rootfs that was read-only before a fork
// is not made writable when the fork ends.
func TestReadonlyRootStaysReadonly(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	live, err := overlay.Find(upperOf(t, rm))
	if err != nil || live.Target == "" {
		t.Fatalf("find the mount of %s: %v", p, err)
	}
	if err := overlay.Remount(live, true); err != nil {
		t.Fatal(err)
	}
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("read-only rootfs made writable by a fork: %v", err)
	}
}

// TestNesting64: branches stack 64 deep; the deepest commits all the way
// up, one level at a time.
func TestNesting64(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	const depth = 64
	ids := []string{branch.RootID}
	var deepest branch.Info
	for i := 0; i < depth; i++ {
		kids, err := s.Fork(ctx, sb.ctx(ids[len(ids)-1]), 1)
		if err != nil {
			t.Fatalf("fork at depth %d: %v", i, err)
		}
		ids = append(ids, kids[0].ID)
		deepest = kids[0]
	}
	d := mountAt(t, deepest.Mounts)
	if got := readFile(t, filepath.Join(d, "etc", "base.conf")); got != "from the image\n" {
		t.Fatalf("depth %d reads %q", depth, got)
	}
	writeFile(t, filepath.Join(d, "deep"), "from the bottom\n")
	if err := mount.UnmountAll(d, 0); err != nil {
		t.Fatal(err)
	}
	for i := len(ids) - 1; i > 0; i-- {
		if _, err := s.CommitBranch(ctx, sb.ctx(ids[i])); err != nil {
			t.Fatalf("commit depth %d: %v", i, err)
		}
	}
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	if got := readFile(t, filepath.Join(p, "deep")); got != "from the bottom\n" {
		t.Fatalf("root reads %q", got)
	}
}

// TestConcurrentCommitters: 64 siblings commit at once; exactly one wins,
// every other gets a stale error naming it, and the parent holds the
// winner's change.
func TestConcurrentCommitters(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	const n = 64
	kids, err := s.Fork(ctx, sb.ctx(""), n)
	if err != nil {
		t.Fatal(err)
	}
	views := map[string]fstest.Tree{}
	for i, k := range kids {
		d := mountAt(t, k.Mounts)
		writeFile(t, filepath.Join(d, "winner"), k.ID)
		writeFile(t, filepath.Join(d, "data", k.ID), strings.Repeat(k.ID, i*100))
		if i%2 == 0 {
			os.Remove(filepath.Join(d, "etc", "base.conf"))
		}
		if views[k.ID], err = fstest.Scan(d); err != nil {
			t.Fatal(err)
		}
		if err := mount.UnmountAll(d, 0); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []string
		errs    []error
	)
	for _, k := range kids {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			_, err := s.CommitBranch(ctx, sb.ctx(id))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				winners = append(winners, id)
			} else {
				errs = append(errs, err)
			}
		}(k.ID)
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d winners: %v", len(winners), winners)
	}
	for _, err := range errs {
		var se *branch.StaleError
		if !errors.As(err, &se) || se.Winner != winners[0] {
			t.Fatalf("loser error %v does not name winner %s", err, winners[0])
		}
	}
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	if got := readFile(t, filepath.Join(p, "winner")); got != winners[0] {
		t.Fatalf("parent holds %q, winner was %s", got, winners[0])
	}
	got, err := fstest.Scan(p)
	if err != nil {
		t.Fatal(err)
	}
	if diffs := fstest.DiffTrees(views[winners[0]], got); len(diffs) > 0 {
		t.Fatalf("parent differs from the winner %s: %v", winners[0], diffs)
	}
	entries, _ := os.ReadDir(filepath.Join(s.root, "branches", s.mustID(t, ctx, sb.key)))
	if len(entries) != 0 {
		t.Fatalf("branch layers left: %d", len(entries))
	}
}

// TestRemoveRootRemovesTree: removing the sandbox snapshot (as containerd
// does when the container goes) removes its whole branch tree, and branches
// never show in Walk, so containerd's collector never sees them.
func TestRemoveRootRemovesTree(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	kids, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fork(ctx, sb.ctx(kids[0].ID), 2); err != nil {
		t.Fatal(err)
	}
	mountAt(t, kids[1].Mounts) // a live mount of a branch is detached on removal
	var walked []string
	s.Walk(ctx, func(_ context.Context, i snapshots.Info) error { walked = append(walked, i.Name); return nil })
	if len(walked) != 2 {
		t.Fatalf("walk lists %v; branches must not be listed", walked)
	}
	if err := s.Commit(ctx, "x", sb.key); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("committing a root with live branches: %v", err)
	}
	id := s.mustID(t, ctx, sb.key)
	if err := s.Remove(ctx, sb.key); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.root, "branches", id)); !os.IsNotExist(err) {
		t.Fatalf("branch layers survive their root: %v", err)
	}
	if m, _ := overlay.Find(filepath.Join(s.root, "branches", id, kids[1].ID, "fs")); m.Target != "" {
		t.Fatalf("branch still mounted at %s", m.Target)
	}
	if _, err := s.Tree(ctx, sb.root); !errdefs.IsNotFound(err) {
		t.Fatalf("tree of removed root: %v", err)
	}
}

func TestBranchBadInput(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	id := s.mustID(t, ctx, sb.key)
	for _, tc := range []struct {
		name string
		err  error
		is   func(error) bool
		says string
	}{
		{"zero count", func() error { _, err := s.Fork(ctx, sb.ctx(""), 0); return err }(), errdefs.IsInvalidArgument, "count"},
		{"huge count", func() error { _, err := s.Fork(ctx, sb.ctx(""), 100000); return err }(), errdefs.IsInvalidArgument, "count"},
		{"no root", func() error { _, err := s.Fork(ctx, branch.Ref{}, 1); return err }(), errdefs.IsInvalidArgument, "no root snapshot"},
		{"unknown key", func() error { _, err := s.Fork(ctx, branch.Ref{Root: branch.Root{Key: "nope"}}, 1); return err }(), errdefs.IsNotFound, `"nope"`},
		{"committed snapshot", func() error { _, err := s.Fork(ctx, branch.Ref{Root: branch.Root{Key: "sb-base"}}, 1); return err }(), errdefs.IsFailedPrecondition, "only active snapshots"},
		{"upperdir outside root", func() error {
			_, err := s.Fork(ctx, branch.Ref{Root: branch.Root{Upperdir: "/etc"}}, 1)
			return err
		}(), errdefs.IsInvalidArgument, "not inside the snapshotter root"},
		{"upperdir with dotdot", func() error {
			_, err := s.Fork(ctx, branch.Ref{Root: branch.Root{Upperdir: s.root + "/snapshots/" + id + "/fs/../../" + id + "/fs"}}, 1)
			return err
		}(), errdefs.IsInvalidArgument, "clean"},
		{"upperdir not an upper", func() error {
			_, err := s.Fork(ctx, branch.Ref{Root: branch.Root{Upperdir: s.root + "/snapshots/" + id + "/work"}}, 1)
			return err
		}(), errdefs.IsInvalidArgument, "not a snapshot's or a branch's upper"},
		{"unknown branch", func() error { _, err := s.CommitBranch(ctx, sb.ctx("42")); return err }(), errdefs.IsNotFound, `branch "42" of "sb"`},
		{"non-numeric branch", func() error { _, err := s.Abort(ctx, sb.ctx("../1")); return err }(), errdefs.IsInvalidArgument, "not a number"},
		{"commit the root", func() error { _, err := s.CommitBranch(ctx, sb.ctx("")); return err }(), errdefs.IsInvalidArgument, "no parent"},
		{"abort the root", func() error { _, err := s.Abort(ctx, sb.ctx("0")); return err }(), errdefs.IsInvalidArgument, "cannot be aborted"},
		{"key and upperdir", func() error {
			_, err := s.Fork(ctx, branch.Ref{Root: branch.Root{Key: "sb", Upperdir: s.upperPath(id)}}, 1)
			return err
		}(), errdefs.IsInvalidArgument, "not both"},
	} {
		if tc.err == nil || !tc.is(tc.err) || !strings.Contains(tc.err.Error(), tc.says) {
			t.Errorf("%s: got %v, want the right kind saying %q", tc.name, tc.err, tc.says)
		}
	}
	// Named by its upper directory (a shim's call), the message names the
	// branch and not the snapshotter's internal path.
	if _, err := s.CommitBranch(ctx, branch.Ref{Root: branch.Root{Upperdir: s.upperPath(id)}, Branch: "42"}); !errdefs.IsNotFound(err) || strings.Contains(err.Error(), s.root) || !strings.Contains(err.Error(), `branch "42"`) {
		t.Errorf("unknown branch by upperdir: %v; want not found, naming the branch and not %s", err, s.root)
	}
	// Addressing by upper directory works, for the root and for a branch.
	if _, err := s.Tree(ctx, branch.Root{Upperdir: s.upperPath(id)}); err != nil {
		t.Fatal(err)
	}
	m, err := s.BranchMounts(ctx, branch.Ref{Root: branch.Root{Upperdir: filepath.Join(s.branchDir(id, kids[0].ID), "fs")}})
	if err != nil || len(m) != 1 {
		t.Fatalf("mounts by branch upperdir: %v %v", m, err)
	}
	tree, _ := s.Tree(ctx, sb.root)
	if len(tree.Nodes) != 2 {
		t.Fatalf("bad calls changed the tree: %+v", tree.Nodes)
	}
}

// TestTombstonesBounded: ended branches are remembered for their error
// messages, the newest maxTombstones of them.
func TestTombstonesBounded(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	var ids []string
	for _, n := range []int{1024, 10} {
		kids, err := s.Fork(ctx, sb.ctx(""), n)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range kids {
			ids = append(ids, k.ID)
		}
	}
	for _, id := range ids {
		if _, err := s.Abort(ctx, sb.ctx(id)); err != nil {
			t.Fatal(err)
		}
	}
	tree, err := s.Tree(ctx, sb.root)
	if err != nil {
		t.Fatal(err)
	}
	if len(tree.Nodes) != maxTombstones+1 {
		t.Fatalf("%d nodes listed, want the root and %d tombstones", len(tree.Nodes), maxTombstones)
	}
	if _, err := s.Abort(ctx, sb.ctx(ids[0])); !errdefs.IsNotFound(err) || strings.Contains(err.Error(), "aborted") {
		t.Fatalf("oldest tombstone still known: %v", err)
	}
	if _, err := s.Abort(ctx, sb.ctx(ids[len(ids)-1])); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "was aborted") {
		t.Fatalf("newest tombstone forgotten: %v", err)
	}
}

// TestForkSealsEveryMount: when Fork returns, every mount of the parent
// refuses writes, not only the one the snapshotter finds (a second mount
// stands for the container's own root in its mount namespace), though the
// superblock's remount may still be syncing; and a file open for writing
// through any mount of it fails the fork, leaving no child.
func TestForkSealsEveryMount(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	p := mountAt(t, rm)
	other := t.TempDir()
	if err := unix.Mount(p, other, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(other, unix.MNT_DETACH) })

	for round := 0; round < 20; round++ {
		kids, err := s.Fork(ctx, sb.ctx(""), 1)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, dir := range []string{p, other} {
			if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
				t.Fatalf("round %d: write through %s after fork: got %v, want EROFS", round, dir, err)
			}
		}
		if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{p, other} {
			if err := os.WriteFile(filepath.Join(dir, "x"), []byte{byte(round)}, 0o644); err != nil {
				t.Fatalf("round %d: write through %s after abort: %v", round, dir, err)
			}
		}
	}

	f, err := os.OpenFile(filepath.Join(other, "x"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Fork(ctx, sb.ctx(""), 2)
	f.Close()
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "open for writing") {
		t.Fatalf("fork with a writer open on another mount: got %v, want a failed precondition naming the open file", err)
	}
	tr, err := s.Tree(ctx, sb.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range tr.Nodes {
		if n.ID == branch.RootID && len(n.Children) != 0 {
			t.Fatalf("a failed fork left children %v", n.Children)
		}
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); err != nil {
		t.Fatalf("a failed fork left the parent sealed: %v", err)
	}
}
