//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// deepScript builds (or, with "cat", reads) /tmp/d/d/... levels deep, in
// steps of 1,000 levels (2,000 bytes of path, under PATH_MAX), and writes
// or reads the file "leaf" at the bottom.
func deepScript(levels int, last string) string {
	return fmt.Sprintf(`p=$(i=0; while [ $i -lt 1000 ]; do printf d/; i=$((i+1)); done)
cd /tmp || exit 1
n=0; while [ $n -lt %d ]; do %s cd -P "$p" || exit 1; n=$((n+1)); done
%s`, levels/1000, map[bool]string{true: `mkdir -p "$p" &&`, false: ""}[last != "cat leaf"], last)
}

// TestDeepTreeCommitThroughSocket: a branch forked from inside a sandbox,
// through its branch socket, makes a tree 5,000 and 10,000 levels deep and
// commits itself. The commit either lands whole (the sandbox's running
// process reads the leaf at the bottom) or is refused before its decision
// with nothing changed (the branch is still live and can be aborted, the
// sandbox has no part of the tree); it never wedges the tree, and the
// sandbox forks again afterwards.
func TestDeepTreeCommitThroughSocket(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	importInsockImage(t, ctx, env)
	runInsockSandbox(t, ctx, env, "deep", true, "echo x > /state; exec sleep 100000")
	in := func(args ...string) (string, error) { return execIn(ctx, env, "deep", args...) }
	tree := func() selfTree {
		out, err := in("branchctl", "self", "tree", "--json")
		if err != nil {
			t.Fatal(err)
		}
		return parseSelfTree(t, out)
	}
	for _, levels := range []int{5000, 10000} {
		var kids []client.BranchInfo
		out, err := in("branchctl", "self", "fork", "-n", "1", "--json")
		if err != nil || json.Unmarshal([]byte(out), &kids) != nil || len(kids) != 1 {
			t.Fatalf("fork: %q %v", out, err)
		}
		b := kids[0].ID
		if out, err := in("branchctl", "self", "exec", b, "--", "sh", "-c", deepScript(levels, "echo bottom > leaf")); err != nil {
			t.Fatalf("%d levels in branch %s: %q %v", levels, b, out, err)
		}
		cout, cerr := in("branchctl", "self", "commit", b)
		st := tree().state(b)
		switch {
		case cerr == nil:
			if st.State != branch.Committed {
				t.Fatalf("%d levels: commit answered %q but branch %s is %s", levels, cout, b, st.State)
			}
			if out, err := in("sh", "-c", deepScript(levels, "cat leaf")); err != nil || out != "bottom\n" {
				t.Fatalf("%d levels: the sandbox reads %q (%v) at the bottom after the commit", levels, out, err)
			}
		case st.State == branch.Live:
			// Refused before the decision: it must say so, and nothing of
			// the tree may have reached the sandbox.
			if !errdefs.IsInvalidArgument(cerr) && !errdefs.IsFailedPrecondition(cerr) && !errdefs.IsResourceExhausted(cerr) && !strings.Contains(cerr.Error(), "deep") {
				t.Fatalf("%d levels: commit refused with an unclear error: %v", levels, cerr)
			}
			t.Logf("%d levels: refused before the decision: %v", levels, cerr)
			if _, err := in("test", "-e", "/tmp/d"); err == nil {
				t.Fatalf("%d levels: a refused commit left part of the tree in the sandbox", levels)
			}
			if _, err := in("branchctl", "self", "abort", b); err != nil {
				t.Fatalf("%d levels: abort after a refused commit: %v", levels, err)
			}
		default:
			t.Fatalf("%d levels: commit failed (%v) and left branch %s %s: neither done nor refused before its decision", levels, cerr, b, st.State)
		}
		// The tree is usable: the sandbox forks and aborts again.
		if _, err := in("branchctl", "self", "fork", "-n", "1", "--json"); err != nil {
			t.Fatalf("%d levels: fork after the commit: %v", levels, err)
		}
		for _, c := range tree().Branches {
			if c.ID != branch.RootID && c.State == branch.Live {
				if _, err := in("branchctl", "self", "abort", c.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := in("rm", "-rf", "/tmp/d"); err != nil {
			t.Logf("remove the deep tree: %v", err)
		}
	}
}
