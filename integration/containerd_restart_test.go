//go:build linux

package integration

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestContainerdRestart: containerd is restarted under a sandbox with live
// branches (a node's containerd upgraded or crashed: its shims outlive
// it), killed and then stopped. While it is down, a client connected to
// the sandbox's shim forks, aborts, commits and lists; once it is back, branchctl sees the
// same tree, runs a command in a branch, forks and checkpoints; a branch's
// command ran on throughout; ctr sees the task running; a commit and an
// abort end the branches, and the sandbox's delete (the test's clean-up)
// leaves nothing.
func TestContainerdRestart(t *testing.T) {
	ctx, env, _ := shimEnvWith(t, daemons.Config{})
	sc := runSandbox(t, ctx, env, "docker.io/branchbox/busybox:test", "sleep", "100000")
	bc := func(args ...string) string {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: %d %q %q", args, code, out, errOut)
		}
		return out
	}
	ticks := func() int {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", "exec", "sb/1", "--", "wc", "-l", "/tick")
		n, err := strconv.Atoi(strings.Fields(out + " x")[0])
		if code != 0 || err != nil {
			t.Fatalf("count the ticks of branch 1's command: %d %q %q", code, out, errOut)
		}
		return n
	}
	bc("fork", "sb", "--", "sh", "-c", "while true; do date >> /tick; sleep 0.05; done")
	bc("fork", "sb")
	waitUntil(t, "branch 1's command ticking", 10*time.Second, func() bool { return ticks() > 0 })
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		before := ticks()
		if err := env.StopContainerd(sig); err != nil {
			t.Fatal(err)
		}
		down, cancel := context.WithTimeout(ctx, 10*time.Second)
		kids, err := sc.Fork(down, client.ForkOptions{Count: 1})
		if err != nil || len(kids) != 1 {
			t.Fatalf("%v: fork through the shim while containerd is down: %v %v", sig, kids, err)
		}
		// A commit and an abort too, in a subtree of their own.
		sub, err := sc.Fork(down, client.ForkOptions{Parent: kids[0].ID, Count: 3})
		if err != nil {
			t.Fatalf("%v: fork of 3 while containerd is down: %v", sig, err)
		}
		if _, err := sc.Abort(down, sub[2].ID); err != nil {
			t.Fatalf("%v: abort while containerd is down: %v", sig, err)
		}
		if _, err := sc.Commit(down, sub[0].ID); err != nil {
			t.Fatalf("%v: commit while containerd is down: %v", sig, err)
		}
		nodes, err := sc.Tree(down)
		cancel()
		if err != nil {
			t.Fatalf("%v: tree while containerd is down: %v", sig, err)
		}
		if err := env.StartContainerd(ctx); err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, n := range nodes {
			if n.State == branch.Live {
				live++
			}
		}
		tree := bc("tree", "sb")
		if got := strings.Count(tree, " live "); got != live {
			t.Fatalf("%v: after the restart branchctl sees %d live nodes, the shim %d while containerd was down:\n%s", sig, got, live, tree)
		}
		if !strings.Contains(tree, "└─ "+kids[0].ID+" ") {
			t.Fatalf("%v: the branch forked while containerd was down is not in the tree:\n%s", sig, tree)
		}
		if out := bc("exec", "sb/"+kids[0].ID, "--", "sh", "-c", "echo hi > /x && cat /x"); out != "hi\n" {
			t.Fatalf("%v: exec in the branch forked while containerd was down: %q", sig, out)
		}
		bc("fork", "sb/"+kids[0].ID)
		bc("checkpoint", "sb", "c-"+strconv.Itoa(int(sig)))
		waitUntil(t, "branch 1's command ticking on", 10*time.Second, func() bool { return ticks() > before })
		if out, err := env.Ctr(ctx, "task", "ls"); err != nil || !strings.Contains(out, "RUNNING") {
			t.Fatalf("%v: ctr task ls after the restart: %q %v", sig, out, err)
		}
	}
	bc("commit", "sb/2")
	if out := bc("tree", "sb"); strings.Count(out, " live ") != 1 {
		t.Fatalf("after the commit of branch 2, its siblings are still live:\n%s", out)
	}
}
