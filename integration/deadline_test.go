//go:build linux

package integration

import (
	"context"
	"fmt"
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
	live := func() []client.BranchInfo {
		tree, err := sc.Tree(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []client.BranchInfo
		for _, n := range tree {
			if n.ID != branch.RootID && n.State == branch.Live {
				out = append(out, n)
			}
		}
		return out
	}
	settled := func(what string, want int) []client.BranchInfo {
		t.Helper()
		var got []client.BranchInfo
		waitUntil(t, fmt.Sprintf("%s: %d live branches", what, want), 10*time.Second, func() bool {
			got = live()
			return len(got) == want
		})
		for _, n := range got {
			if n.Status == "frozen" {
				t.Fatalf("%s: branch %s left frozen: %+v", what, n.ID, n)
			}
		}
		return got
	}
	// op sets up (untimed) and returns the call to time.
	sweep := func(what string, op func(i int) func(ctx context.Context) error, after func(i int, err error)) {
		call := op(-1)
		t0 := time.Now()
		if err := call(ctx); err != nil {
			t.Fatalf("%s with no deadline: %v", what, err)
		}
		whole := time.Since(t0)
		after(-1, nil)
		failed := 0
		for i := 0; i < 60; i++ {
			call := op(i)
			dctx, cancel := context.WithTimeout(ctx, whole*time.Duration(i%30)/20)
			err := call(dctx)
			cancel()
			if err != nil {
				failed++
			}
			after(i, err)
		}
		t.Logf("%s: a whole call %v; %d of 60 failed at their deadline", what, whole, failed)
	}

	sweep("fork", func(i int) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := sc.Fork(ctx, client.ForkOptions{Count: 2})
			return err
		}
	}, func(i int, err error) {
		want := 2
		if err != nil {
			want = 0
		}
		for _, n := range settled(fmt.Sprintf("fork %d (%v)", i, err), want) {
			if _, err := sc.Abort(ctx, n.ID); err != nil {
				t.Fatalf("abort %s after fork %d: %v", n.ID, i, err)
			}
		}
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
		cks, lerr := sc.Checkpoints(ctx)
		if lerr != nil {
			t.Fatal(lerr)
		}
		found := false
		for _, ck := range cks {
			found = found || ck.Name == name
		}
		if found != (err == nil) {
			t.Fatalf("%s: listed %v; want it kept only when made: %+v", what, found, cks)
		}
		if !found {
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
