//go:build linux

package integration

import (
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/patterns"

	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestPatterns drives every exploration pattern through real branches of
// one running sandbox, through the Go client and through branchctl: the
// winner's files show up in the sandbox's running container, every branch
// a pattern made has ended when it returns, and a branch that times out
// is aborted with its processes.
func TestPatterns(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	sh := func(s string) patterns.Command { return patterns.Command{Args: []string{"sh", "-c", s}} }
	// check asserts the pattern's result, what the sandbox sees, and that
	// no branch is left.
	check := func(t *testing.T, r *patterns.Result, err error, winner int, file, want string, outcomes ...patterns.Outcome) {
		t.Helper()
		if err != nil {
			t.Fatalf("%v (result %+v)", err, r)
		}
		var got []patterns.Outcome
		for _, a := range r.Attempts {
			got = append(got, a.Outcome)
		}
		if r.Winner != winner || len(got) != len(outcomes) || strings.Join(outcomeStrings(got), ",") != strings.Join(outcomeStrings(outcomes), ",") {
			t.Fatalf("winner %d, outcomes %v; want %d, %v (attempts %+v)", r.Winner, got, winner, outcomes, r.Attempts)
		}
		if file != "" {
			if out, err := execIn(ctx, env, "sb", "cat", file); err != nil || out != want {
				t.Fatalf("sandbox's %s: %q %v; want %q", file, out, err, want)
			}
		}
		assertOnlyRoot(t, ctx, sc)
	}

	t.Run("speculate", func(t *testing.T) {
		r, err := patterns.Speculate(ctx, sc, "", []patterns.Command{
			sh("exit 1"),
			sh("sleep 0.3; echo spec-1 > /spec"),
			sh("sleep 93.1; echo spec-2 > /spec"),
		}, patterns.Options{})
		check(t, r, err, 1, "/spec", "spec-1\n", patterns.OutcomeFailed, patterns.OutcomeCommitted, patterns.OutcomeLost)
		assertNoProcess(t, "sleep", "93.1")
	})

	t.Run("speculate branch timeout", func(t *testing.T) {
		r, err := patterns.Speculate(ctx, sc, "", []patterns.Command{sh("sleep 93.2; echo late > /late"), sh("exit 3")},
			patterns.Options{BranchTimeout: time.Second})
		check(t, r, err, -1, "", "", patterns.OutcomeTimeout, patterns.OutcomeFailed)
		if r.Attempts[1].ExitCode != 3 || r.TimedOut {
			t.Fatalf("result %+v", r)
		}
		assertNoProcess(t, "sleep", "93.2")
		if out, err := execIn(ctx, env, "sb", "sh", "-c", "test -e /late || echo absent"); err != nil || out != "absent\n" {
			t.Fatalf("the timed-out branch's file reached the sandbox: %q %v", out, err)
		}
	})

	t.Run("best-of-n", func(t *testing.T) {
		// Scores 0, 1, 2 by the file each writes; 2 wins.
		r, err := patterns.BestOfN(ctx, sc, "", 3,
			sh(`echo bon-$BRANCH_INDEX > /bon; echo $(( BRANCH_INDEX * 7 % 3 )) > /bon-score`),
			patterns.Scorer{File: "/bon-score"}, patterns.Options{})
		check(t, r, err, 2, "/bon", "bon-2\n", patterns.OutcomeLost, patterns.OutcomeLost, patterns.OutcomeCommitted)
		if *r.Attempts[1].Score != 1 {
			t.Fatalf("scores %+v", r.Attempts)
		}
	})

	t.Run("tournament", func(t *testing.T) {
		// The judge prefers the larger number each attempt prints.
		r, err := patterns.Tournament(ctx, sc, "", 3, sh(`echo tour-$BRANCH_INDEX > /tour; echo $BRANCH_INDEX`),
			patterns.Judge{Args: []string{"sh", "-c", `[ "$(cat "$BRANCHBOX_A")" -ge "$(cat "$BRANCHBOX_B")" ] && echo a || echo b`}},
			patterns.Options{})
		check(t, r, err, 2, "/tour", "tour-2\n", patterns.OutcomeLost, patterns.OutcomeLost, patterns.OutcomeCommitted)
		if len(r.Matches) != 2 || r.Matches[0].Winner != 1 || r.Matches[1].Winner != 2 || r.Matches[0].Error != "" {
			t.Fatalf("matches %+v", r.Matches)
		}
	})

	t.Run("reflexion", func(t *testing.T) {
		r, err := patterns.Reflexion(ctx, sc, "", 3, sh(`if [ -n "$BRANCHBOX_FEEDBACK" ] && grep -q retry-me "$BRANCHBOX_FEEDBACK" && [ "$BRANCHBOX_FEEDBACK_EXIT" = 4 ]; then echo fixed > /refl; else echo retry-me; exit 4; fi`), patterns.Options{})
		check(t, r, err, 1, "/refl", "fixed\n", patterns.OutcomeFailed, patterns.OutcomeCommitted)
		if out, err := execIn(ctx, env, "sb", "sh", "-c", "test -e "+patterns.FeedbackPath+" || echo absent"); err != nil || out != "absent\n" {
			t.Fatalf("the feedback file reached the sandbox: %q %v", out, err)
		}
	})

	// Searches: each step appends its index to a file whose digits are
	// the score, so the path of 1s wins; the winner is committed up
	// through its parent (nested commits).
	step := sh(`printf %s "$BRANCH_INDEX" >> /search; [ "$BRANCHBOX_DEPTH" -ge 1 ]`)
	score := patterns.Scorer{Args: []string{"cat", "/search"}}
	t.Run("beam", func(t *testing.T) {
		mustExecIn(t, ctx, env, "rm", "-f", "/search")
		r, err := patterns.BeamSearch(ctx, sc, "", step, score, patterns.SearchOptions{Width: 2, Depth: 2, Keep: 2}, patterns.Options{})
		// Level 1 keeps 0 and 1; level 2 keeps 11 and 10 (pruning 00,
		// 01, and so 0); 11 commits into 1, 1 into the sandbox.
		check(t, r, err, 5, "/search", "11", patterns.OutcomePruned, patterns.OutcomeCommitted,
			patterns.OutcomePruned, patterns.OutcomePruned, patterns.OutcomeLost, patterns.OutcomeCommitted)
		if len(r.Path) != 2 || r.Path[0] != r.Attempts[1].Branch || r.Attempts[5].Parent != r.Attempts[1].Branch {
			t.Fatalf("path %v, attempts %+v", r.Path, r.Attempts)
		}
	})
	t.Run("tree-search", func(t *testing.T) {
		mustExecIn(t, ctx, env, "rm", "-f", "/search")
		r, err := patterns.TreeSearch(ctx, sc, "", step, score, patterns.SearchOptions{Width: 2, Depth: 2, Budget: 2}, patterns.Options{})
		check(t, r, err, 3, "/search", "11", patterns.OutcomeLost, patterns.OutcomeCommitted, patterns.OutcomeLost, patterns.OutcomeCommitted)
	})

	t.Run("branchctl speculate", func(t *testing.T) {
		out, errOut, code := branchctl(t, ctx, env, "", "speculate", "sb", "--json", "-c", "exit 1", "-c", "sleep 0.5; echo cli > /cli-spec")
		var r patterns.Result
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("speculate: code %d, %q %s", code, out, errOut)
		}
		check(t, &r, nil, 1, "/cli-spec", "cli\n", patterns.OutcomeFailed, patterns.OutcomeCommitted)
		// Nothing succeeds: exit 1, and the table says so.
		out, _, code = branchctl(t, ctx, env, "", "speculate", "sb", "-n", "2", "--", "false")
		if code != 1 || !strings.Contains(out, "nothing committed") || strings.Count(out, "failed") != 2 {
			t.Fatalf("speculate of a failing command: code %d\n%s", code, out)
		}
		assertOnlyRoot(t, ctx, sc)
	})

	t.Run("branchctl best-of-n overall timeout", func(t *testing.T) {
		out, errOut, code := branchctl(t, ctx, env, "", "best-of-n", "sb", "-n", "2", "--timeout", "2s", "--json", "--",
			"sh", "-c", `if [ $BRANCH_INDEX = 1 ]; then sleep 93.3; fi; echo bon2-$BRANCH_INDEX > /bon2; echo 5`)
		var r patterns.Result
		if code != 0 || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("best-of-n: code %d, %q %s", code, out, errOut)
		}
		check(t, &r, nil, 0, "/bon2", "bon2-0\n", patterns.OutcomeCommitted, patterns.OutcomeTimeout)
		if !r.TimedOut || *r.Attempts[0].Score != 5 {
			t.Fatalf("result %+v", r)
		}
		assertNoProcess(t, "sleep", "93.3")
	})

	t.Run("branchctl tournament table", func(t *testing.T) {
		out, errOut, code := branchctl(t, ctx, env, "", "tournament", "sb", "-n", "2", "--judge", "echo b", "--", "sh", "-c", "echo t2-$BRANCH_INDEX > /t2")
		if code != 0 || !strings.Contains(out, "ROUND") || !strings.Contains(out, "committed attempt 1") {
			t.Fatalf("tournament: code %d\n%s%s", code, out, errOut)
		}
		if got, err := execIn(ctx, env, "sb", "cat", "/t2"); err != nil || got != "t2-1\n" {
			t.Fatalf("sandbox's /t2: %q %v", got, err)
		}
		assertOnlyRoot(t, ctx, sc)
	})

	t.Run("branchctl bad usage", func(t *testing.T) {
		for _, args := range [][]string{
			{"best-of-n", "sb", "--", "true"},
			{"speculate", "sb"},
			{"tournament", "sb", "-n", "2", "--", "true"},
			{"beam", "sb", "--keep", "0", "--", "true"},
			{"reflexion", "sb"},
		} {
			_, errOut, code := branchctl(t, ctx, env, "", args...)
			if code != 2 || !strings.Contains(errOut, "hint: see `branchctl help`") {
				t.Errorf("branchctl %v: code %d, %q; want usage error 2", args, code, errOut)
			}
		}
		assertOnlyRoot(t, ctx, sc)
	})
}

func outcomeStrings(os []patterns.Outcome) []string {
	var out []string
	for _, o := range os {
		out = append(out, string(o))
	}
	return out
}

// assertOnlyRoot checks that the sandbox has no live branch left.
func assertOnlyRoot(t *testing.T, ctx context.Context, sc *client.SandboxClient) {
	t.Helper()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID != branch.RootID && (n.State == branch.Live || n.State == branch.Committing) {
			t.Fatalf("branch %s left %s", n.ID, n.State)
		}
		if n.ID == branch.RootID && (n.Sealed || len(n.Children) > 0) {
			t.Fatalf("sandbox still sealed (children %v)", n.Children)
		}
	}
}

// assertNoProcess checks from the host that no process runs argv (the
// tests give their long sleeps unusual lengths to find them).
func assertNoProcess(t *testing.T, argv ...string) {
	t.Helper()
	want := strings.Join(argv, "\x00") + "\x00"
	waitFor(t, func() bool {
		found := false
		dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, d := range dirs {
			if b, err := os.ReadFile(d); err == nil && string(b) == want {
				found = true
			}
		}
		return !found
	})
}

func mustExecIn(t *testing.T, ctx context.Context, env *daemons.Env, args ...string) {
	t.Helper()
	if out, err := execIn(ctx, env, "sb", args...); err != nil {
		t.Fatalf("%v in the sandbox: %v %s", args, err, out)
	}
}
