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
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/snapshotter/fstree"
)

// mountCheckpoint mounts checkpoint name's state read-only, as rollback
// does, for comparing it with what the context showed when it was taken.
func mountCheckpoint(t *testing.T, ctx context.Context, s *Snapshotter, sb sandbox, name string) string {
	t.Helper()
	var lowers []string
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		r, _, err := s.resolve(ctx, Context{Root: sb.root})
		if err != nil {
			return err
		}
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		ck := d.Checkpoints[name]
		if ck == nil {
			return fmt.Errorf("no checkpoint %q", name)
		}
		for _, seq := range ck.Chain {
			lowers = append(lowers, filepath.Join(s.checkpointDir(r.id(), seq), "fs"))
		}
		lowers = append(lowers, s.lowerDirs(r, tree, ck.Context)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mountAt(t, []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"ro", "index=off", "lowerdir=" + strings.Join(lowers, ":")}}})
}

func scan(t *testing.T, dir string) fstree.Tree {
	t.Helper()
	tr, err := fstree.Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func sameTree(t *testing.T, what string, want fstree.Tree, dir string) {
	t.Helper()
	if diffs := fstree.DiffTrees(want, scan(t, dir)); len(diffs) > 0 {
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

// TestCheckpointRollbackExact: checkpoints record exactly what the context
// showed, and rollback (through the live mount, and through a temporary one
// when the context is not mounted) brings back exactly that, in any order,
// after changes of every kind and random ones.
func TestCheckpointRollbackExact(t *testing.T) {
	for _, mounted := range []bool{true, false} {
		t.Run(fmt.Sprintf("mounted=%v", mounted), func(t *testing.T) {
			rng := seeded(t)
			ctx, s := newTest(t)
			sb := newSandbox(t, ctx, s, "sb")
			rm, _ := s.Mounts(ctx, sb.key)
			live := mountAt(t, rm)
			// Unmounted, the context is mounted only to change or look at
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
			want := map[string]fstree.Tree{}
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
// since the previous one, however much the context changed before.
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
	check("delete a base", s.DeleteCheckpoint(ctx, sb.root, "a"), errdefs.IsFailedPrecondition, "checkpoints b hold their changes relative to it")

	kids, err := s.ForkFrom(ctx, sb.ctx(""), 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	check("rollback with children", s.Rollback(ctx, sb.ctx(""), "b"), errdefs.IsFailedPrecondition, "live children (1)")
	check("delete under a branch", s.DeleteCheckpoint(ctx, sb.root, "a"), errdefs.IsFailedPrecondition, "branches 1 are built on it")
	if _, err := s.Checkpoint(ctx, sb.ctx(kids[0].ID), "kid"); err != nil {
		t.Fatal(err)
	}
	check("rollback to another context's", s.Rollback(ctx, sb.ctx(kids[0].ID), "a"), errdefs.IsInvalidArgument, "is of context 0")
	_, err = s.ForkFrom(ctx, sb.ctx(""), 1, "kid")
	check("fork from another context's", err, errdefs.IsInvalidArgument, "fork that context")

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

func mustRootID(t *testing.T, ctx context.Context, s *Snapshotter, sb sandbox) string {
	t.Helper()
	var id string
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) error {
		r, _, err := s.resolve(ctx, Context{Root: sb.root})
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
