//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/fstest"
)

// mountCheckpoint mounts checkpoint name (of the sandbox)
// read-only through CheckpointMounts, as a push mounts it, for comparing
// it with what the branch showed when it was taken.
func mountCheckpoint(t *testing.T, ctx context.Context, s *Snapshotter, sb sandbox, name string) string {
	t.Helper()
	ms, err := s.CheckpointMounts(ctx, sb.ctx(""), name)
	if err != nil {
		t.Fatal(err)
	}
	return mountAt(t, ms)
}

func scan(t *testing.T, dir string) fstest.Tree {
	t.Helper()
	tr, err := fstest.Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func sameTree(t *testing.T, what string, want fstest.Tree, dir string) {
	t.Helper()
	if diffs := fstest.DiffTrees(want, scan(t, dir)); len(diffs) > 0 {
		if len(diffs) > 10 {
			diffs = diffs[:10]
		}
		t.Fatalf("%s: trees differ: %v", what, diffs)
	}
}

func seeded(t *testing.T) *rand.Rand {
	seed := time.Now().UnixNano()
	if v := os.Getenv("BRANCHBOX_SEED"); v != "" {
		fmt.Sscan(v, &seed)
	}
	t.Logf("seed %d (set BRANCHBOX_SEED to replay)", seed)
	return rand.New(rand.NewSource(seed))
}

// TestCheckpointRollbackExact: checkpoints record exactly what the branch
// showed, and rollback (through the live mount, and through a temporary one
// when the branch is not mounted) brings back exactly that, in any order,
// after changes of every kind and random ones.
func TestCheckpointRollbackExact(t *testing.T) {
	for _, mounted := range []bool{true, false} {
		t.Run(fmt.Sprintf("mounted=%v", mounted), func(t *testing.T) {
			rng := seeded(t)
			ctx, s := newTest(t)
			sb := newSandbox(t, ctx, s, "sb")
			rm, _ := s.Mounts(ctx, sb.key)
			live := mountAt(t, rm)
			// Unmounted, the branch is mounted only to change or look at
			// it, and unmounted before each operation.
			up := true
			view := func() string {
				if !up {
					if err := mount.All(rm, live); err != nil {
						t.Fatal(err)
					}
					up = true
				}
				return live
			}
			done := func() {
				if !mounted && up {
					if err := mount.UnmountAll(live, 0); err != nil {
						t.Fatal(err)
					}
					up = false
				}
			}
			change := func(f func(d string)) { f(view()); done() }
			want := map[string]fstest.Tree{}
			checkpoint := func(name string) {
				t.Helper()
				want[name] = scan(t, view())
				done()
				if _, err := s.Checkpoint(ctx, sb.ctx(""), name); err != nil {
					t.Fatal(err)
				}
				sameTree(t, "state of checkpoint "+name, want[name], mountCheckpoint(t, ctx, s, sb, name))
			}
			rollback := func(name string) {
				t.Helper()
				done()
				if err := s.Rollback(ctx, sb.ctx(""), name); err != nil {
					t.Fatal(err)
				}
				sameTree(t, "after rollback to "+name, want[name], view())
				done()
			}

			checkpoint("empty")
			change(func(d string) { everyKind(t, d) })
			checkpoint("every-kind")
			change(func(d string) { randomChanges(t, rng, d, 20) })
			checkpoint("random")
			change(func(d string) { randomChanges(t, rng, d, 20) })
			rollback("every-kind")
			rollback("random")
			rollback("empty")
			rollback("every-kind")
			change(func(d string) { randomChanges(t, rng, d, 20) })
			checkpoint("after-rollback") // built on every-kind, the head
			rollback("random")
			rollback("after-rollback")
			// Rolling back to the state it is in changes nothing.
			rollback("after-rollback")
		})
	}
}

// TestCheckpointCostFollowsChange: a checkpoint copies only what changed
// since the previous one, however much the branch changed before.
func TestCheckpointCostFollowsChange(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	live := mountAt(t, rm)
	for i := 0; i < 200; i++ {
		writeFile(t, filepath.Join(live, "data", fmt.Sprint(i)), strings.Repeat("x", 4096))
	}
	// Older than a clock tick: not copied again as possibly changed.
	time.Sleep(100 * time.Millisecond)
	first, err := s.Checkpoint(ctx, sb.ctx(""), "one")
	if err != nil {
		t.Fatal(err)
	}
	if first.Size != 200*4096 {
		t.Fatalf("first checkpoint holds %d bytes, want %d", first.Size, 200*4096)
	}
	writeFile(t, filepath.Join(live, "data", "7"), "changed")
	second, err := s.Checkpoint(ctx, sb.ctx(""), "two")
	if err != nil {
		t.Fatal(err)
	}
	// The file, and its directory and the root (their attributes).
	if second.Size != int64(len("changed")) || second.Entries > 3 || second.Parent != "one" || second.Depth != 2 {
		t.Fatalf("second checkpoint: %+v, want only the one changed file over \"one\"", second)
	}
}

// TestCheckpointRefusals: each refusal says why, with its errdefs kind, and
// changes nothing.
func TestCheckpointRefusals(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	live := mountAt(t, rm)
	writeFile(t, filepath.Join(live, "f"), "1")
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "a"); err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error, is func(error) bool, text string) {
		t.Helper()
		if err == nil || !is(err) || !strings.Contains(err.Error(), text) {
			t.Fatalf("%s: got %v, want an error saying %q", what, err, text)
		}
	}
	_, err := s.Checkpoint(ctx, sb.ctx(""), "a")
	check("same name twice", err, errdefs.IsAlreadyExists, "already exists")
	_, err = s.Checkpoint(ctx, sb.ctx(""), "a/x")
	check("bad name", err, errdefs.IsInvalidArgument, "may hold only")
	check("rollback to nothing", s.Rollback(ctx, sb.ctx(""), "nope"), errdefs.IsNotFound, "no checkpoint named")
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "b"); err != nil {
		t.Fatal(err)
	}

	kids, err := s.ForkFrom(ctx, sb.ctx(""), 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	check("rollback with children", s.Rollback(ctx, sb.ctx(""), "b"), errdefs.IsFailedPrecondition, "live children (1)")
	check("delete under a branch", s.DeleteCheckpoint(ctx, sb.root, "a"), errdefs.IsFailedPrecondition, "branches 1 are built on it")
	if _, err := s.Checkpoint(ctx, sb.ctx(kids[0].ID), "kid"); err != nil {
		t.Fatal(err)
	}
	check("rollback to another branch's", s.Rollback(ctx, sb.ctx(kids[0].ID), "a"), errdefs.IsInvalidArgument, "is of branch 0")
	_, err = s.ForkFrom(ctx, sb.ctx(""), 1, "kid")
	check("fork from another branch's", err, errdefs.IsInvalidArgument, "fork that branch")
	_, err = s.CheckpointMounts(ctx, sb.ctx(""), "nope")
	check("mounts of no checkpoint", err, errdefs.IsNotFound, `no checkpoint "nope"`)
	_, err = s.CheckpointMounts(ctx, sb.ctx(""), "kid")
	check("mounts of another branch's", err, errdefs.IsInvalidArgument, "is of branch "+kids[0].ID)
	if ms, err := s.CheckpointMounts(ctx, sb.ctx(kids[0].ID), "kid"); err != nil {
		t.Fatal(err)
	} else if b, err := os.ReadFile(filepath.Join(mountAt(t, ms), "f")); err != nil || string(b) != "1" {
		t.Fatalf("checkpoint kid's state reads f = %q (%v)", b, err)
	}

	// A branch's checkpoints end with it.
	kidDir := s.checkpointDir(mustRootID(t, ctx, s, sb), 3)
	if _, err := os.Stat(kidDir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kidDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("checkpoint layer of an aborted branch: %v", err)
	}
	list, err := s.Checkpoints(ctx, sb.root)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "a" || list[1].Name != "b" || !list[1].Head || list[0].Children[0] != "b" {
		t.Fatalf("checkpoints after abort: %+v", list)
	}
	if err := s.DeleteCheckpoint(ctx, sb.root, "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteCheckpoint(ctx, sb.root, "a"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(s.checkpointBase(mustRootID(t, ctx, s, sb))); len(entries) != 0 {
		t.Fatalf("layers left after deleting every checkpoint: %v", entries)
	}
}

// TestDeleteMiddleCheckpoint: deleting a checkpoint others build on frees
// its name at once and keeps its layer exactly as long as a remaining
// checkpoint's chain stacks it; rollbacks to the rest stay exact.
func TestDeleteMiddleCheckpoint(t *testing.T) {
	rng := seeded(t)
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	live := mountAt(t, rm)
	rootID := mustRootID(t, ctx, s, sb)
	want := map[string]fstest.Tree{}
	checkpoint := func(name string) {
		t.Helper()
		randomChanges(t, rng, live, 20)
		want[name] = scan(t, live)
		if _, err := s.Checkpoint(ctx, sb.ctx(""), name); err != nil {
			t.Fatal(err)
		}
	}
	rollback := func(name string) {
		t.Helper()
		randomChanges(t, rng, live, 20)
		if err := s.Rollback(ctx, sb.ctx(""), name); err != nil {
			t.Fatal(err)
		}
		sameTree(t, "after rollback to "+name, want[name], live)
	}
	list := func() map[string]branch.Checkpoint {
		t.Helper()
		l, err := s.Checkpoints(ctx, sb.root)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]branch.Checkpoint{}
		for _, c := range l {
			out[c.Name] = c
		}
		return out
	}
	layers := func(want ...uint64) {
		t.Helper()
		// Cleanup must not take a deleted checkpoint's layer still stacked.
		if err := s.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		entries, err := os.ReadDir(s.checkpointBase(rootID))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		var have []string
		for _, e := range entries {
			have = append(have, e.Name())
		}
		if fmt.Sprint(have) != fmt.Sprint(want) {
			t.Fatalf("checkpoint layers %v, want %v", have, want)
		}
	}

	checkpoint("a") // layer 1
	checkpoint("b") // layer 2, over a
	checkpoint("c") // layer 3, over b
	if err := s.DeleteCheckpoint(ctx, sb.root, "b"); err != nil {
		t.Fatal(err)
	}
	l := list()
	if _, ok := l["b"]; ok || len(l) != 2 || l["c"].Parent != deletedParent || l["c"].Depth != 3 || len(l["a"].Children) != 0 {
		t.Fatalf("checkpoints after deleting b: %+v", l)
	}
	layers(1, 2, 3)
	if err := s.Rollback(ctx, sb.ctx(""), "b"); !errdefs.IsNotFound(err) {
		t.Fatalf("rollback to a deleted checkpoint: %v, want not found", err)
	}
	if _, err := s.ForkFrom(ctx, sb.ctx(""), 1, "b"); !errdefs.IsNotFound(err) {
		t.Fatalf("fork from a deleted checkpoint: %v, want not found", err)
	}
	sameTree(t, "state of c", want["c"], mountCheckpoint(t, ctx, s, sb, "c"))
	rollback("c")
	rollback("a")
	rollback("c")

	// A live branch forked from c still keeps it.
	kids, err := s.ForkFrom(ctx, sb.ctx(""), 1, "c")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteCheckpoint(ctx, sb.root, "c"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "branches 1 are built on it") {
		t.Fatalf("delete under a branch: %v", err)
	}
	if _, err := s.Abort(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatal(err)
	}

	// The name is free: a new b, over a; c's parent is not taken for it.
	rollback("a")
	checkpoint("b") // layer 4, over a
	l = list()
	if l["b"].Parent != "a" || l["c"].Parent != deletedParent || fmt.Sprint(l["a"].Children) != "[b]" || len(l["b"].Children) != 0 {
		t.Fatalf("checkpoints after reusing b: %+v", l)
	}
	rollback("c")
	rollback("b")
	layers(1, 2, 3, 4)

	// The last checkpoint stacking the old b goes, and its layer with it.
	if err := s.DeleteCheckpoint(ctx, sb.root, "c"); err != nil {
		t.Fatal(err)
	}
	layers(1, 4)
	// The oldest, with a checkpoint built on it: kept until that goes.
	if err := s.DeleteCheckpoint(ctx, sb.root, "a"); err != nil {
		t.Fatal(err)
	}
	layers(1, 4)
	rollback("b")
	if err := s.DeleteCheckpoint(ctx, sb.root, "b"); err != nil {
		t.Fatal(err)
	}
	layers()
	if l := list(); len(l) != 0 {
		t.Fatalf("checkpoints after deleting all: %+v", l)
	}
	// The next checkpoint starts a new chain.
	checkpoint("d")
	if l := list(); l["d"].Depth != 1 || l["d"].Parent != "" {
		t.Fatalf("first checkpoint after deleting all: %+v", l["d"])
	}
	rollback("d")
}

func mustRootID(t *testing.T, ctx context.Context, s *Snapshotter, sb sandbox) string {
	t.Helper()
	var id string
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) error {
		r, _, err := s.resolve(ctx, branch.Ref{Root: sb.root})
		id = r.id()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestForkFromCheckpoint: branches forked from a checkpoint see its state,
// not the current one; committing one makes the parent's state the
// branch's exactly, through the parent's live mount.
func TestForkFromCheckpoint(t *testing.T) {
	rng := seeded(t)
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	live := mountAt(t, rm)
	everyKind(t, live)
	want := scan(t, live)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "base"); err != nil {
		t.Fatal(err)
	}
	randomChanges(t, rng, live, 20)
	writeFile(t, filepath.Join(live, "after-checkpoint"), "parent moved on\n")
	kids, err := s.ForkFrom(ctx, sb.ctx(""), 2, "base")
	if err != nil {
		t.Fatal(err)
	}
	if kids[0].FromCheckpoint != "base" {
		t.Fatalf("fork result: %+v", kids[0].Node)
	}
	d := mountAt(t, kids[1].Mounts)
	sameTree(t, "a branch forked from the checkpoint", want, d)
	randomChanges(t, rng, d, 20)
	writeFile(t, filepath.Join(d, "attempt"), "from the checkpoint\n")
	child := scan(t, d)
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[1].ID)); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "parent after committing a branch forked from a checkpoint", child, live)
	// The parent's next checkpoint builds on the one the branch came from.
	info, err := s.Checkpoint(ctx, sb.ctx(""), "next")
	if err != nil {
		t.Fatal(err)
	}
	if info.Parent != "base" {
		t.Fatalf("checkpoint after the commit builds on %q, want base", info.Parent)
	}
	if err := s.Rollback(ctx, sb.ctx(""), "base"); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "rollback after the commit", want, live)
}

// TestCheckpointOfBranch: a branch's own checkpoints and rollbacks work over
// its sealed parent's layers.
func TestCheckpointOfBranch(t *testing.T) {
	rng := seeded(t)
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "sb")
	kids, err := s.Fork(ctx, sb.ctx(""), 1)
	if err != nil {
		t.Fatal(err)
	}
	d := mountAt(t, kids[0].Mounts)
	randomChanges(t, rng, d, 15)
	want := scan(t, d)
	if _, err := s.Checkpoint(ctx, sb.ctx(kids[0].ID), "k"); err != nil {
		t.Fatal(err)
	}
	randomChanges(t, rng, d, 15)
	if err := s.Rollback(ctx, sb.ctx(kids[0].ID), "k"); err != nil {
		t.Fatal(err)
	}
	sameTree(t, "branch after rollback", want, d)
}

// TestRollbackCallerCancelled: a rollback whose caller goes away once it is
// decided (a shim killed, a client that gives up) is completed all the
// same, not left pending until a restart: the branch shows the
// checkpoint and the checkpoint can be deleted at once.
func TestRollbackCallerCancelled(t *testing.T) {
	ctx, s0 := newTest(t)
	s0.Close()
	var cancelAt atomic.Pointer[context.CancelFunc]
	s, err := New(ctx, s0.Root(), WithFaultHook(func(p string) {
		if c := cancelAt.Load(); c != nil && p == FaultRollbackDecided {
			(*c)()
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sb := newSandbox(t, ctx, s, "sb")
	rm, _ := s.Mounts(ctx, sb.key)
	live := mountAt(t, rm)
	want := scan(t, live)
	if _, err := s.Checkpoint(ctx, sb.ctx(""), "clean"); err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		if err := os.WriteFile(filepath.Join(live, fmt.Sprintf("f%04d", i)), []byte("later"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancelAt.Store(&cancel)
	if err := s.Rollback(cctx, sb.ctx(""), "clean"); err != nil {
		t.Logf("the cancelled caller was told: %v", err)
	}
	cancelAt.Store(nil)
	sameTree(t, "after a rollback whose caller left", want, live)
	if err := s.DeleteCheckpoint(ctx, sb.root, "clean"); err != nil {
		t.Fatalf("delete the checkpoint after the rollback: %v", err)
	}
}
