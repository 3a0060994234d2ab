//go:build linux

package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// TestDeadlineSweep: an agent gives each call a deadline. Whatever moment
// of a fork, a commit, an abort, a checkpoint or a rollback the deadline
// falls on, the sandbox is left in a state the user can see and go on
// from: the call made or not made whole, no live branch nobody knows of,
// no branch left frozen, and the same call made again without a deadline
// does what it says. Deadlines fall from the call's start to 1.5 times a
// whole call, twice.
func TestDeadlineSweep(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	d := sweeper{t: t, ctx: ctx, sc: sc, rounds: 2}
	sweep, settled := d.sweep, d.settled

	sweep("fork", func(i int) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := sc.Fork(ctx, client.ForkOptions{Count: 2})
			return err
		}
	}, func(i int, err error) {
		d.abortForked(fmt.Sprintf("fork %d (%v)", i, err), 2, err, nil)
	})

	var kid string
	sweep("commit", func(i int) func(context.Context) error {
		kid = fork(t, ctx, sc, client.ForkOptions{Count: 2})[0].ID
		mustRun(t, ctx, sc, kid, "sh", "-c", fmt.Sprintf("echo %d > /won", i))
		return func(ctx context.Context) error {
			_, err := sc.Commit(ctx, kid)
			return err
		}
	}, func(i int, err error) {
		what := fmt.Sprintf("commit %d (%v)", i, err)
		if err != nil {
			// Made, or not: asked again, it is made (or says it was).
			if _, err := sc.Commit(ctx, kid); err != nil && !strings.Contains(err.Error(), "committed") {
				t.Fatalf("%s: commit again: %v", what, err)
			}
		}
		settled(what, 0)
		if out, err := execIn(ctx, env, "sb", "cat", "/won"); err != nil || out != fmt.Sprintf("%d\n", i) {
			t.Fatalf("%s: the sandbox's /won: %q %v", what, out, err)
		}
	})

	sweep("abort", func(i int) func(context.Context) error {
		kid = fork(t, ctx, sc, client.ForkOptions{Count: 1})[0].ID
		return func(ctx context.Context) error {
			_, err := sc.Abort(ctx, kid)
			return err
		}
	}, func(i int, err error) {
		what := fmt.Sprintf("abort %d (%v)", i, err)
		if err != nil {
			if _, err := sc.Abort(ctx, kid); err != nil && !strings.Contains(err.Error(), "not found") && !strings.Contains(err.Error(), "aborted") {
				t.Fatalf("%s: abort again: %v", what, err)
			}
		}
		settled(what, 0)
	})

	sweep("checkpoint", func(i int) func(context.Context) error {
		if _, err := execIn(ctx, env, "sb", "sh", "-c", fmt.Sprintf("echo %d > /ck", i)); err != nil {
			t.Fatal(err)
		}
		return func(ctx context.Context) error {
			_, err := sc.Checkpoint(ctx, branch.RootID, fmt.Sprintf("c%d", i+1))
			return err
		}
	}, func(i int, err error) {
		what := fmt.Sprintf("checkpoint %d (%v)", i, err)
		name := fmt.Sprintf("c%d", i+1)
		if !d.keptWhenMade(what, name, err) {
			if _, err := sc.Checkpoint(ctx, branch.RootID, name); err != nil {
				t.Fatalf("%s: checkpoint again: %v", what, err)
			}
		}
		if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo later > /ck"); err != nil {
			t.Fatal(err)
		}
		if err := sc.Rollback(ctx, branch.RootID, name); err != nil {
			t.Fatalf("%s: rollback to it: %v", what, err)
		}
		if out, err := execIn(ctx, env, "sb", "cat", "/ck"); err != nil || out != fmt.Sprintf("%d\n", i) {
			t.Fatalf("%s: /ck after the rollback: %q %v", what, out, err)
		}
	})

	sweep("rollback", func(i int) func(context.Context) error {
		if _, err := execIn(ctx, env, "sb", "sh", "-c", fmt.Sprintf("echo r%d > /ck", i)); err != nil {
			t.Fatal(err)
		}
		return func(ctx context.Context) error { return sc.Rollback(ctx, branch.RootID, "c0") }
	}, func(i int, err error) {
		what := fmt.Sprintf("rollback %d (%v)", i, err)
		if err != nil {
			if err := sc.Rollback(ctx, branch.RootID, "c0"); err != nil {
				t.Fatalf("%s: rollback again: %v", what, err)
			}
		}
		if out, err := execIn(ctx, env, "sb", "cat", "/ck"); err != nil || out != "-1\n" {
			t.Fatalf("%s: /ck after the rollback: %q %v", what, out, err)
		}
	})
}

// TestDeadlineSweepBranches: the sweep of TestDeadlineSweep for a fork from
// a checkpoint, a commit of a branch into its parent branch, and a branch's
// rollback to its checkpoint, one round each.
func TestDeadlineSweepBranches(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	d := sweeper{t: t, ctx: ctx, sc: sc, rounds: 1}
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo base > /ck"); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Checkpoint(ctx, "", "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo later > /ck"); err != nil {
		t.Fatal(err)
	}
	d.sweep("fork from a checkpoint", func(i int) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := sc.Fork(ctx, client.ForkOptions{Count: 2, From: "base"})
			return err
		}
	}, func(i int, err error) {
		what := fmt.Sprintf("fork --from %d (%v)", i, err)
		d.abortForked(what, 2, err, func(n client.BranchInfo) {
			if out := mustRun(t, ctx, sc, n.ID, "cat", "/ck"); out != "base\n" {
				t.Fatalf("%s: %s /ck %q", what, n.ID, out)
			}
		})
	})
	// Nested: a branch of a branch, committed into its parent.
	var parent, kid string
	d.sweep("nested commit", func(i int) func(context.Context) error {
		parent = fork(t, ctx, sc, client.ForkOptions{Count: 1})[0].ID
		kid = fork(t, ctx, sc, client.ForkOptions{Count: 2, Parent: parent})[0].ID
		mustRun(t, ctx, sc, kid, "sh", "-c", fmt.Sprintf("echo %d > /nested", i))
		return func(ctx context.Context) error {
			_, err := sc.Commit(ctx, kid)
			return err
		}
	}, func(i int, err error) {
		what := fmt.Sprintf("nested commit %d (%v)", i, err)
		if err != nil {
			if _, err := sc.Commit(ctx, kid); err != nil && !strings.Contains(err.Error(), "committed") {
				t.Fatalf("%s: commit again: %v", what, err)
			}
		}
		d.settled(what, 1)
		if out := mustRun(t, ctx, sc, parent, "cat", "/nested"); out != fmt.Sprintf("%d\n", i) {
			t.Fatalf("%s: parent's /nested %q", what, out)
		}
		if _, err := sc.Abort(ctx, parent); err != nil {
			t.Fatal(err)
		}
		d.settled(what, 0)
	})
	// A branch's own rollback.
	d.sweep("branch rollback", func(i int) func(context.Context) error {
		parent = fork(t, ctx, sc, client.ForkOptions{Count: 1})[0].ID
		mustRun(t, ctx, sc, parent, "sh", "-c", "echo one > /b")
		if _, err := sc.Checkpoint(ctx, parent, fmt.Sprintf("b%d", i+3)); err != nil {
			t.Fatal(err)
		}
		mustRun(t, ctx, sc, parent, "sh", "-c", "echo two > /b; echo x > /extra")
		return func(ctx context.Context) error { return sc.Rollback(ctx, parent, fmt.Sprintf("b%d", i+3)) }
	}, func(i int, err error) {
		what := fmt.Sprintf("branch rollback %d (%v)", i, err)
		if err != nil {
			if err := sc.Rollback(ctx, parent, fmt.Sprintf("b%d", i+3)); err != nil {
				t.Fatalf("%s: again: %v", what, err)
			}
		}
		if out := mustRun(t, ctx, sc, parent, "sh", "-c", "cat /b; ls /extra 2>&1 || true"); !strings.HasPrefix(out, "one\n") || !strings.Contains(out, "No such file") {
			t.Fatalf("%s: %q", what, out)
		}
		if _, err := sc.Abort(ctx, parent); err != nil {
			t.Fatal(err)
		}
		d.settled(what, 0)
	})
}

// sweeper gives calls deadlines over their length (sweep) and checks what
// the sandbox's branches are left as (settled).
type sweeper struct {
	t   *testing.T
	ctx context.Context
	sc  *client.SandboxClient
	// rounds is how many times the deadlines go from 0 to 1.5 calls.
	rounds int
}

func (d sweeper) live() []client.BranchInfo {
	tree, err := d.sc.Tree(d.ctx)
	if err != nil {
		d.t.Fatal(err)
	}
	var out []client.BranchInfo
	for _, n := range tree {
		if n.ID != branch.RootID && n.State == branch.Live {
			out = append(out, n)
		}
	}
	return out
}

// settled waits until the sandbox has want live branches, none frozen.
func (d sweeper) settled(what string, want int) []client.BranchInfo {
	d.t.Helper()
	var got []client.BranchInfo
	waitUntil(d.t, fmt.Sprintf("%s: %d live branches", what, want), 10*time.Second, func() bool {
		got = d.live()
		return len(got) == want
	})
	for _, n := range got {
		if n.Status == "frozen" {
			d.t.Fatalf("%s: branch %s left frozen: %+v", what, n.ID, n)
		}
	}
	return got
}

// abortForked waits until a fork of n branches, whose call returned err,
// has left them all live if it succeeded and none if it failed, checks
// each with check (if not nil), and aborts them.
func (d sweeper) abortForked(what string, n int, err error, check func(client.BranchInfo)) {
	d.t.Helper()
	if err != nil {
		n = 0
	}
	for _, b := range d.settled(what, n) {
		if check != nil {
			check(b)
		}
		if _, err := d.sc.Abort(d.ctx, b.ID); err != nil {
			d.t.Fatalf("%s: abort %s: %v", what, b.ID, err)
		}
	}
}

// keptWhenMade fails the test unless checkpoint name, whose call returned
// err, is listed exactly when the call succeeded, and says whether it is.
func (d sweeper) keptWhenMade(what, name string, err error) bool {
	d.t.Helper()
	cks, lerr := d.sc.Checkpoints(d.ctx)
	if lerr != nil {
		d.t.Fatal(lerr)
	}
	listed := slices.ContainsFunc(cks, func(ck branch.Checkpoint) bool { return ck.Name == name })
	if listed != (err == nil) {
		d.t.Fatalf("%s: listed %v; want it kept only when made: %+v", what, listed, cks)
	}
	return listed
}

// sweep times op's call with no deadline (i -3 to -1; the median), then
// makes it 30 times a round with deadlines from 0 to 1.5 times that;
// after checks what each left. op sets up, untimed, and returns the call.
func (d sweeper) sweep(what string, op func(i int) func(ctx context.Context) error, after func(i int, err error)) {
	var took []time.Duration
	for i := -3; i < 0; i++ {
		call := op(i)
		t0 := time.Now()
		if err := call(d.ctx); err != nil {
			d.t.Fatalf("%s with no deadline: %v", what, err)
		}
		took = append(took, time.Since(t0))
		after(i, nil)
	}
	slices.Sort(took)
	whole := took[1] // the first call after a set-up can be much longer
	failed, n := 0, 30*d.rounds
	for i := 0; i < n; i++ {
		call := op(i)
		dctx, cancel := context.WithTimeout(d.ctx, whole*time.Duration(i%30)/20)
		err := call(dctx)
		cancel()
		if err != nil {
			failed++
		}
		after(i, err)
	}
	d.t.Logf("%s: a whole call %v; %d of %d failed at their deadline", what, whole, failed, n)
}

// TestDeadlineSweepMemory: the same for a memory fork and a checkpoint
// with memory, whose dump stops the sandbox's processes (a REPL): whatever
// the deadline cuts, the REPL goes on answering, and what the call's error
// says was not made is not there. One round: a memory fork is 50 times a
// plain one.
func TestDeadlineSweepMemory(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	d := sweeper{t: t, ctx: ctx, sc: sc, rounds: 1}
	k := -1 // the REPL's commands are numbered from 0
	alive := func(what string) {
		t.Helper()
		k++
		if out := strings.TrimSpace(replIn(t, ctx, env, sc, branch.RootID, k, "echo alive")); out != "alive" {
			t.Fatalf("%s: the sandbox's REPL answered %q", what, out)
		}
	}
	d.sweep("memory fork", func(i int) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := sc.Fork(ctx, client.ForkOptions{Count: 2, WithMemory: true})
			return err
		}
	}, func(i int, err error) {
		what := fmt.Sprintf("memory fork %d (%v)", i, err)
		d.abortForked(what, 2, err, nil)
		alive(what)
	})
	d.sweep("checkpoint with memory", func(i int) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := sc.Checkpoint(ctx, branch.RootID, fmt.Sprintf("m%d", i+1), client.CheckpointWithMemory())
			return err
		}
	}, func(i int, err error) {
		what := fmt.Sprintf("checkpoint with memory %d (%v)", i, err)
		name := fmt.Sprintf("m%d", i+1)
		if d.keptWhenMade(what, name, err) {
			// Bounded: the sandbox's checkpoints.
			if err := sc.DeleteCheckpoint(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
		alive(what)
	})
	assertNoMemoryImages(t, env)
}
