//go:build linux

package snapshotter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/fstest"
)

// loopExt4 is fstest.LoopExt4, as root.
func loopExt4(t *testing.T, sizeMB int) string {
	t.Helper()
	requireRoot(t)
	return fstest.LoopExt4(t, sizeMB)
}

// fill writes into a new file at p until fewer than leave bytes are free,
// or the filesystem says ENOSPC.
func fill(p string, leave int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{0xa5}, 256<<10)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Dir(p), &st); err != nil {
			return err
		}
		if int64(st.Bavail)*st.Bsize < leave {
			return nil
		}
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return nil
			}
			return err
		}
	}
}

// removeAndSync removes files on the filesystem at mnt and syncs it: ext4
// counts the blocks of a removed file as free only once its journal has
// committed the removal.
func removeAndSync(t *testing.T, mnt string, files ...string) {
	t.Helper()
	for _, f := range files {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
}

// treeStates is every node of a tree with its state, for "nothing changed".
func treeStates(t *testing.T, ctx context.Context, s *Snapshotter, sb sandbox) string {
	t.Helper()
	info, err := s.Tree(ctx, sb.root)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, n := range info.Nodes {
		rows = append(rows, fmt.Sprintf("%s:%s:epoch=%d:sealed=%v:kids=%v", n.ID, n.State, n.Epoch, n.Sealed, n.Children))
	}
	return strings.Join(rows, " ")
}

// nodeState reads a branch's state from the stored tree (Tree would also
// measure every upper, which grows with each commit).
func nodeState(t *testing.T, ctx context.Context, s *Snapshotter, sb sandbox, id string) branch.State {
	t.Helper()
	var st branch.State
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		r, _, err := s.resolve(ctx, branch.Ref{Root: sb.root})
		if err != nil {
			return err
		}
		tree, err := loadTree(tx, r.id())
		if err != nil || tree == nil {
			return err
		}
		if n := tree.Nodes[id]; n != nil {
			st = n.State
		} else if n, ok := tree.Ended(id); ok {
			st = n.State
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st == "" {
		t.Fatalf("branch %s not in the tree", id)
	}
	return st
}

func sameAs(t *testing.T, what string, want fstest.Tree, dir string) {
	t.Helper()
	got, err := fstest.Scan(dir)
	if err != nil {
		t.Fatalf("%s: scan: %v", what, err)
	}
	if diffs := fstest.DiffTrees(want, got); len(diffs) > 0 {
		if len(diffs) > 10 {
			diffs = diffs[:10]
		}
		t.Fatalf("%s: %d differences: %v", what, len(diffs), diffs)
	}
}

// TestCommitRefusedWhenItDoesNotFit: on a small ext4 root, a commit that
// needs more space than is free is refused before its decision, with an
// error saying so, and nothing changes: the tree, the parent's tree
// through its live mount, its seal. Once space is freed it commits.
func TestCommitRefusedWhenItDoesNotFit(t *testing.T) {
	mnt := loopExt4(t, 96)
	ctx := context.Background()
	s, err := New(ctx, filepath.Join(mnt, "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	parent := mountAt(t, rm)
	writeFile(t, filepath.Join(parent, "parent-own"), "the parent's\n")
	kids, err := s.Fork(ctx, sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	d := mountAt(t, kids[0].Mounts)
	big := bytes.Repeat([]byte("branch data "), 3<<20) // 36 MiB
	if err := os.WriteFile(filepath.Join(d, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(d, "app", "main.txt"), "version 2\n")
	want, err := fstest.Scan(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := fill(filepath.Join(mnt, "filler"), 20<<20); err != nil {
		t.Fatal(err)
	}
	before, err := fstest.Scan(parent)
	if err != nil {
		t.Fatal(err)
	}
	states := treeStates(t, ctx, s, sb)

	_, err = s.CommitBranch(ctx, sb.ctx(kids[0].ID))
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "commit of branch "+kids[0].ID+" needs ") ||
		!strings.Contains(err.Error(), "free under "+s.Root()) || !strings.Contains(err.Error(), "nothing changed") {
		t.Fatalf("commit that does not fit: want a resource-exhausted refusal naming the space, got %v", err)
	}
	t.Logf("refused: %v", err)
	if got := treeStates(t, ctx, s, sb); got != states {
		t.Fatalf("tree changed by a refused commit:\n before %s\n after  %s", states, got)
	}
	sameAs(t, "parent after a refused commit", before, parent)
	if err := os.WriteFile(filepath.Join(parent, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("parent unsealed by a refused commit: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.Root(), journalDirName)); len(entries) != 0 {
		t.Fatalf("journal left by a refused commit: %v", entries)
	}

	removeAndSync(t, mnt, filepath.Join(mnt, "filler"))
	res, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID))
	if err != nil {
		t.Fatalf("commit once space is free: %v", err)
	}
	if len(res.Plan.Invalidated) != 1 || res.Plan.Invalidated[0] != kids[1].ID {
		t.Fatalf("commit invalidated %v, want [%s]", res.Plan.Invalidated, kids[1].ID)
	}
	sameAs(t, "parent after the commit", want, parent)
}

// faultyCommit is a sandbox on a small ext4 root whose parent has files of
// its own that a branch changes, replaces, removes and adds to. hook, if
// set, runs at each fault point.
type faultyCommit struct {
	mnt    string
	s      *Snapshotter
	sb     sandbox
	parent string
	hook   atomic.Pointer[func(string)]
}

func newFaultyCommit(t *testing.T, ctx context.Context) *faultyCommit {
	f := &faultyCommit{mnt: loopExt4(t, 128)}
	s, err := New(ctx, filepath.Join(f.mnt, "root"), WithFaultHook(func(p string) {
		if h := f.hook.Load(); h != nil {
			(*h)(p)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	f.s = s
	f.sb = newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, f.sb.key)
	f.parent = mountAt(t, rm)
	chunk := bytes.Repeat([]byte("parent "), 64<<10/7)
	for i := range 40 {
		if err := os.MkdirAll(filepath.Join(f.parent, "p", "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.parent, "p", fmt.Sprintf("f%02d", i)), chunk, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.parent, "p", "sub", fmt.Sprintf("s%02d", i)), chunk[:100], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// branchChanges forks two branches and makes, in the first, changes of
// every kind over the parent's files and about 24 MB of new data; it
// returns the branches and what the first one shows.
func (f *faultyCommit) branchChanges(t *testing.T, ctx context.Context, round int) ([]branch.Info, fstest.Tree) {
	t.Helper()
	kids, err := f.s.Fork(ctx, f.sb.ctx(""), 2)
	if err != nil {
		t.Fatal(err)
	}
	d := mountAt(t, kids[0].Mounts)
	for i := range 40 {
		switch i % 4 {
		case 0:
			writeFile(t, filepath.Join(d, "p", fmt.Sprintf("f%02d", i)), fmt.Sprintf("round %d rewrote it\n", round))
		case 1:
			if err := os.Remove(filepath.Join(d, "p", fmt.Sprintf("f%02d", i))); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		case 2:
			if err := os.Chmod(filepath.Join(d, "p", fmt.Sprintf("f%02d", i)), 0o600); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
	}
	if err := os.RemoveAll(filepath.Join(d, "p", "sub")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(d, "p", "sub"), "a file where a directory was\n")
	// The new data goes beside the changed files, so that an apply that
	// runs out of space midway has changed some of them already.
	data := bytes.Repeat([]byte(fmt.Sprintf("round %d data ", round)), 256<<10/13)
	for i := range 96 {
		if err := os.WriteFile(filepath.Join(d, "p", fmt.Sprintf("n%d-%02d", round, i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := fstest.Scan(d)
	if err != nil {
		t.Fatal(err)
	}
	return kids, want
}

// TestCommitOutOfSpaceAfterDecision: the disk fills after a commit was
// decided, so its apply fails midway. The parent, seen through its live
// mount, must be exactly as before (or, if the apply won the race, exactly
// the branch's): never in between. Then the tree must stay usable: an
// abort abandons the commit, a retry completes it, and forks work.
func TestCommitOutOfSpaceAfterDecision(t *testing.T) {
	for _, then := range []string{"abort", "retry"} {
		t.Run("then="+then, func(t *testing.T) {
			ctx := context.Background()
			f := newFaultyCommit(t, ctx)
			kids, want := f.branchChanges(t, ctx, 0)
			before, err := fstest.Scan(f.parent)
			if err != nil {
				t.Fatal(err)
			}
			filler := filepath.Join(f.mnt, "filler")
			var fillErr error
			hook := func(p string) {
				if p == FaultCommitDecided {
					// Leave less than the 24 MB the apply writes.
					fillErr = fill(filler, 8<<20)
				}
			}
			f.hook.Store(&hook)
			_, err = f.s.CommitBranch(ctx, f.sb.ctx(kids[0].ID))
			f.hook.Store(nil)
			if fillErr != nil {
				t.Fatal(fillErr)
			}
			if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "put back as it was") {
				t.Fatalf("commit on a disk that filled after the decision: want a resource-exhausted error saying the parent was put back, got %v", err)
			}
			t.Logf("failed as expected: %v", err)
			sameAs(t, "parent after a failed apply", before, f.parent)
			if st := nodeState(t, ctx, f.s, f.sb, kids[0].ID); st != branch.Committing {
				t.Fatalf("winner is %s after a failed apply, want committing", st)
			}
			if st := nodeState(t, ctx, f.s, f.sb, kids[1].ID); st != branch.Stale {
				t.Fatalf("loser is %s, want stale", st)
			}
			if _, err := f.s.Fork(ctx, f.sb.ctx(kids[0].ID), 1); !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("fork of a committing branch: %v", err)
			}
			removeAndSync(t, f.mnt, filler)
			switch then {
			case "abort":
				gone, err := f.s.Abort(ctx, f.sb.ctx(kids[0].ID))
				if err != nil || len(gone) != 1 || gone[0] != kids[0].ID {
					t.Fatalf("abort of the committing branch: %v %v", gone, err)
				}
				if st := nodeState(t, ctx, f.s, f.sb, kids[0].ID); st != branch.Aborted {
					t.Fatalf("abandoned branch is %s, want aborted", st)
				}
				sameAs(t, "parent after the abort", before, f.parent)
				if _, err := os.Stat(f.s.branchDir(f.s.mustID(t, ctx, f.sb.key), kids[0].ID)); !os.IsNotExist(err) {
					t.Fatalf("abandoned branch's layer is still there: %v", err)
				}
				// Unsealed: no child is left.
				writeFile(t, filepath.Join(f.parent, "after-abort"), "writable again\n")
				if err := os.Remove(filepath.Join(f.parent, "after-abort")); err != nil {
					t.Fatal(err)
				}
				// The tree goes on: a new fork commits.
				more, want2 := f.branchChanges(t, ctx, 1)
				if _, err := f.s.CommitBranch(ctx, f.sb.ctx(more[0].ID)); err != nil {
					t.Fatalf("commit after the abort: %v", err)
				}
				sameAs(t, "parent after a later commit", want2, f.parent)
			case "retry":
				res, err := f.s.CommitBranch(ctx, f.sb.ctx(kids[0].ID))
				if err != nil {
					t.Fatalf("retried commit: %v", err)
				}
				if res.Plan.Winner != kids[0].ID {
					t.Fatalf("retried commit's plan: %+v", res.Plan)
				}
				sameAs(t, "parent after the retried commit", want, f.parent)
				if st := nodeState(t, ctx, f.s, f.sb, kids[0].ID); st != branch.Committed {
					t.Fatalf("winner is %s after the retry, want committed", st)
				}
			}
			f.s.trash.Wait() // journals are discarded in the background
			if entries, _ := os.ReadDir(filepath.Join(f.s.Root(), journalDirName)); len(entries) != 0 {
				t.Fatalf("journals left: %v", entries)
			}
		})
	}
	// A writer racing the apply for the last free space: whichever wins,
	// the parent is one of the two trees.
	t.Run("racing-writer", func(t *testing.T) {
		ctx := context.Background()
		f := newFaultyCommit(t, ctx)
		failed := 0
		for round := range 3 {
			kids, want := f.branchChanges(t, ctx, round)
			before, err := fstest.Scan(f.parent)
			if err != nil {
				t.Fatal(err)
			}
			// Free space now: what the apply needs and half of it again, so
			// the writer and the apply both can, and one of them runs out.
			filler := filepath.Join(f.mnt, fmt.Sprintf("filler-%d", round))
			if err := fill(filler+"-pre", 36<<20); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var fillErr error
			hook := func(p string) {
				if p == FaultCommitDecided {
					wg.Add(1)
					go func() { defer wg.Done(); fillErr = fill(filler, 0) }()
				}
			}
			f.hook.Store(&hook)
			_, err = f.s.CommitBranch(ctx, f.sb.ctx(kids[0].ID))
			f.hook.Store(nil)
			wg.Wait()
			if fillErr != nil {
				t.Fatal(fillErr)
			}
			removeAndSync(t, f.mnt, filler, filler+"-pre")
			if err != nil {
				failed++
				if !errdefs.IsResourceExhausted(err) {
					t.Fatalf("round %d: %v", round, err)
				}
				sameAs(t, fmt.Sprintf("round %d: parent after a failed apply", round), before, f.parent)
				if _, err := f.s.CommitBranch(ctx, f.sb.ctx(kids[0].ID)); err != nil {
					t.Fatalf("round %d: retry: %v", round, err)
				}
			}
			sameAs(t, fmt.Sprintf("round %d: parent after the commit", round), want, f.parent)
		}
		t.Logf("%d of 3 applies lost the race and were put back, then retried", failed)
	})
}

// mkdirChain makes a chain of n directories "d" under dir, through
// descriptors (its paths outgrow PATH_MAX).
func mkdirChain(t *testing.T, dir string, n int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
}

// chainDepth counts the levels of "d" under dir.
func chainDepth(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		unix.Close(fd)
		if err != nil {
			return n
		}
		fd = next
		n++
	}
}

// TestCommitDeepTrees: a branch whose tree is 5,000 or 10,000 levels deep
// (what `for i in $(seq 5000); do mkdir d && cd d; done` makes), or that
// removes a directory of its parent that deep, is refused before the
// decision with nothing changed, and can still be aborted. One 4,000
// levels deep commits whole.
func TestCommitDeepTrees(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	parent := mountAt(t, rm)
	mkdirChain(t, parent, 5000) // the parent's own deep tree, at "d"
	for _, tc := range []struct {
		name   string
		levels int
		remove bool
	}{{"5000", 5000, false}, {"10000", 10000, false}, {"removes-5000", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			kids, err := s.Fork(ctx, sb.ctx(""), 2)
			if err != nil {
				t.Fatal(err)
			}
			d := mountAt(t, kids[0].Mounts)
			if tc.remove {
				if err := os.RemoveAll(filepath.Join(d, "d")); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := os.Mkdir(filepath.Join(d, "deep"), 0o755); err != nil {
					t.Fatal(err)
				}
				mkdirChain(t, filepath.Join(d, "deep"), tc.levels)
			}
			writeFile(t, filepath.Join(d, "marker"), "must not reach the parent\n")
			states := treeStates(t, ctx, s, sb)
			_, err = s.CommitBranch(ctx, sb.ctx(kids[0].ID))
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "deeper than 4096 levels") || !strings.Contains(err.Error(), "nothing changed") {
				t.Fatalf("commit of a tree too deep: want a refusal before the decision, got %v", err)
			}
			t.Logf("refused: %.300s", err)
			if got := treeStates(t, ctx, s, sb); got != states {
				t.Fatalf("tree changed by a refused commit:\n before %s\n after  %s", states, got)
			}
			if _, err := os.Lstat(filepath.Join(parent, "marker")); !os.IsNotExist(err) {
				t.Fatalf("refused commit reached the parent: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(parent, "deep")); !os.IsNotExist(err) {
				t.Fatalf("refused commit reached the parent: %v", err)
			}
			if n := chainDepth(t, parent); n != 5000 {
				t.Fatalf("parent's own deep tree has %d levels, want 5000", n)
			}
			for _, k := range kids {
				if _, err := s.Abort(ctx, sb.ctx(k.ID)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	t.Run("4000", func(t *testing.T) {
		kids, err := s.Fork(ctx, sb.ctx(""), 1)
		if err != nil {
			t.Fatal(err)
		}
		d := mountAt(t, kids[0].Mounts)
		if err := os.Mkdir(filepath.Join(d, "deep4000"), 0o755); err != nil {
			t.Fatal(err)
		}
		mkdirChain(t, filepath.Join(d, "deep4000"), 4000)
		if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
			t.Fatalf("commit of a 4,000-level tree: %.300s", err)
		}
		if n := chainDepth(t, filepath.Join(parent, "deep4000")); n != 4000 {
			t.Fatalf("parent shows %d levels, want 4000", n)
		}
	})
}

// TestCommitCallerCancelled: a caller whose context ends during a commit
// of 30,000 files (at the decision, 100 ms into the apply, once applied,
// once finished) gets an error or the result; either way the
// commit completes, a later call returns its result, and the parent holds
// all 30,000 files. A caller cancelled before the decision (during the
// pre-decision walk) gets a refusal with nothing changed.
func TestCommitCallerCancelled(t *testing.T) {
	ctx, s0 := newTest(t)
	s0.Close()
	var hook atomic.Pointer[func(string)]
	s, err := New(ctx, s0.Root(), WithFaultHook(func(p string) {
		if h := hook.Load(); h != nil {
			(*h)(p)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	parent := mountAt(t, rm)
	const files = 30000
	branchOf := func(round string) branch.Info {
		kids, err := s.Fork(ctx, sb.ctx(""), 2)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(upperOf(t, kids[0].Mounts), round)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range files {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), []byte(round), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return kids[0]
	}
	checkAll := func(round string) {
		t.Helper()
		entries, err := os.ReadDir(filepath.Join(parent, round))
		if err != nil || len(entries) != files {
			t.Fatalf("%s: parent has %d of %d files (%v)", round, len(entries), files, err)
		}
		if got := readFile(t, filepath.Join(parent, round, fmt.Sprintf("f%05d", files-1))); got != round {
			t.Fatalf("%s: last file holds %q", round, got)
		}
	}
	cancelled := 0
	for _, at := range []string{"decided", "after 100ms", "applied", "finished"} {
		round := strings.ReplaceAll(at, " ", "-")
		k := branchOf(round)
		cctx, cancel := context.WithCancel(ctx)
		h := func(p string) {
			switch {
			case p == FaultCommitDecided && at == "decided",
				p == FaultCommitApplied && at == "applied",
				p == FaultCommitFinished && at == "finished":
				cancel()
			case p == FaultCommitDecided && strings.HasPrefix(at, "after "):
				d, _ := time.ParseDuration(strings.TrimPrefix(at, "after "))
				time.AfterFunc(d, cancel)
			}
		}
		hook.Store(&h)
		res, err := s.CommitBranch(cctx, sb.ctx(k.ID))
		switch {
		case err == nil:
			if res.Plan.Winner != k.ID {
				t.Fatalf("%s: result %+v", at, res.Plan)
			}
		case errors.Is(err, context.Canceled) && strings.Contains(err.Error(), "goes on"):
			cancelled++
		default:
			t.Fatalf("%s: %v", at, err)
		}
		t.Logf("cancelled %s: %v", at, err)
		// Asked again: the commit's result, once it is done.
		again, err := s.CommitBranch(ctx, sb.ctx(k.ID))
		hook.Store(nil)
		cancel()
		if err != nil || again.Plan.Winner != k.ID || again.Plan.Parent != branch.RootID || len(again.Plan.Invalidated) != 1 {
			t.Fatalf("%s: commit asked again: %+v %v", at, again.Plan, err)
		}
		if st := nodeState(t, ctx, s, sb, k.ID); st != branch.Committed {
			t.Fatalf("%s: branch is %s", at, st)
		}
		checkAll(round)
	}
	if cancelled < 2 {
		t.Fatalf("only %d callers saw their cancellation; the test did not cut into commits", cancelled)
	}

	// Cancelled during the walk before the decision: refused, nothing changed.
	k := branchOf("before-decision")
	states := treeStates(t, ctx, s, sb)
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(2*time.Millisecond, cancel)
	_, err = s.CommitBranch(cctx, sb.ctx(k.ID))
	cancel()
	if err == nil {
		t.Log("the walk finished before the cancellation; nothing to check for it")
	} else {
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "nothing changed") {
			t.Fatalf("cancelled before the decision: %v", err)
		}
		if got := treeStates(t, ctx, s, sb); got != states {
			t.Fatalf("tree changed by a commit cancelled before its decision:\n before %s\n after  %s", states, got)
		}
		if _, err := s.CommitBranch(ctx, sb.ctx(k.ID)); err != nil {
			t.Fatal(err)
		}
	}
	checkAll("before-decision")
}

// TestLeftoverJournalsRemovedAtStart: journals a crash left (a commit
// decided before it is completed by recovery, which needs none) are
// removed when the snapshotter starts.
func TestLeftoverJournalsRemovedAtStart(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	root := t.TempDir()
	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(root, journalDirName, "1-2")
	writeFile(t, filepath.Join(left, "1"), "an old inode's last link\n")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := os.Lstat(left); !os.IsNotExist(err) {
		t.Fatalf("leftover journal still there after a start: %v", err)
	}
}
