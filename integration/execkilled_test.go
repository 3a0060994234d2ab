//go:build linux

package integration

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
)

// TestExecKilledWithBranch: a process running when its branch ends is
// killed (137), and its exit status says why the branch ended, as the
// next call on it would: stale naming the winner for a sibling of a
// commit, the end of an aborted one. A process killed on a branch that
// lives on (a kill -9) says nothing of the kind.
func TestExecKilledWithBranch(t *testing.T) {
	ctx, _, sc := sandboxCtxEnv(t)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 3})
	start := func(b string) *client.Process {
		t.Helper()
		p, err := sc.Exec(ctx, b, client.ExecOptions{Args: []string{"sleep", "1000"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	winner, loser, aborted, killed := start(kids[0].ID), start(kids[1].ID), start(kids[2].ID), start(kids[2].ID)
	if err := killed.Kill(ctx, uint32(unix.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if st, err := killed.Wait(ctx); err != nil || st.Code != 137 || st.BranchEnded != "" {
		t.Fatalf("a process killed on a live branch: %+v %v; want 137 and no branch end", st, err)
	}
	if _, err := sc.Abort(ctx, kids[2].ID); err != nil {
		t.Fatal(err)
	}
	if st, err := aborted.Wait(ctx); err != nil || st.Code != 137 || st.BranchEnded == "" {
		t.Fatalf("a process of an aborted branch: %+v %v; want 137 and why its branch ended", st, err)
	} else {
		t.Logf("aborted: %s", st.BranchEnded)
	}
	if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	st, err := loser.Wait(ctx)
	if err != nil || st.Code != 137 || !strings.Contains(st.BranchEnded, "stale") || !strings.Contains(st.BranchEnded, "branch "+kids[0].ID+" committed first") {
		t.Fatalf("a process of a sibling of the commit: %+v %v; want 137, stale, naming branch %s", st, err, kids[0].ID)
	}
	if st, err := winner.Wait(ctx); err != nil || st.Code != 137 || st.BranchEnded == "" {
		t.Fatalf("a process of the committed branch: %+v %v; want 137 and why its branch ended", st, err)
	} else {
		t.Logf("committed: %s", st.BranchEnded)
	}
}
