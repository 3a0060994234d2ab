//go:build linux

package integration

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// TestCheckpointsEndToEnd drives checkpoints of a running sandbox through
// branchctl: checkpoint, list, rollback under the sandbox's running process
// (which sees the old state at once), fork from a checkpoint and commit
// the branch, delete refused while a branch is built on it, and delete of
// a checkpoint another builds on.
func TestCheckpointsEndToEnd(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	ctl := func(args ...string) string {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	sh := func(script string) string {
		t.Helper()
		out, err := execIn(ctx, env, "sb", "sh", "-c", script)
		if err != nil {
			t.Fatalf("%s in the sandbox: %v: %s", script, err, out)
		}
		return out
	}
	var ck branch.Checkpoint
	if err := json.Unmarshal([]byte(ctl("checkpoint", "sb", "first", "--json")), &ck); err != nil || ck.Name != "first" || ck.Branch != "0" {
		t.Fatalf("checkpoint --json: %+v %v", ck, err)
	}
	sh("echo after > /state; echo new > /newfile; rm /bin/true; mkdir -p /work/a; echo x > /work/a/f")
	if out := ctl("checkpoint", "sb", "second"); !strings.Contains(out, "changes since first") {
		t.Fatalf("second checkpoint: %q", out)
	}
	sh("echo third > /state")
	out := ctl("checkpoint", "ls", "sb")
	for _, want := range []string{"first", "second *", "(full)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("checkpoint ls: no %q in\n%s", want, out)
		}
	}
	// The sandbox's own running process (the container's init, sleeping)
	// sees the rollback through its root at once.
	pid := sandboxPid(t, sc)
	ctl("rollback", "sb", "first")
	if b, err := os.ReadFile("/proc/" + pid + "/root/state"); err != nil || string(b) != "before\n" {
		t.Fatalf("the running process reads /state = %q (%v) after rollback, want before", b, err)
	}
	if out := sh("cat /state; ls /newfile /work 2>&1; test -e /bin/true && echo has-true"); !strings.Contains(out, "before") || strings.Count(out, "No such file") != 2 || !strings.Contains(out, "has-true") {
		t.Fatalf("sandbox after rollback to first: %q", out)
	}
	ctl("rollback", "sb", "second")
	if out := sh("cat /state /work/a/f; test -e /bin/true || echo no-true"); out != "after\nx\nno-true\n" {
		t.Fatalf("sandbox after rollback to second: %q", out)
	}

	// Fork from the first checkpoint while the sandbox has moved on.
	var kids []client.BranchInfo
	if err := json.Unmarshal([]byte(ctl("fork", "sb", "--from", "first", "-n", "2", "--json")), &kids); err != nil || len(kids) != 2 {
		t.Fatalf("fork --from: %v", err)
	}
	if out := mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "cat /state; test -e /work || echo no-work; echo branch > /state"); out != "before\nno-work\n" {
		t.Fatalf("branch forked from first sees %q", out)
	}
	_, errOut, code := branchctl(t, ctx, env, "", "checkpoint", "rm", "sb", "first")
	if code == 0 || !strings.Contains(errOut, "built on it") {
		t.Fatalf("rm of a checkpoint with branches on it: %d %q", code, errOut)
	}
	_, errOut, code = branchctl(t, ctx, env, "", "rollback", "sb", "second")
	if code == 0 || !strings.Contains(errOut, "live children") {
		t.Fatalf("rollback with live branches: %d %q", code, errOut)
	}
	ctl("commit", "sb/"+kids[0].ID)
	if out := sh("cat /state; test -e /work || echo no-work; test -e /bin/true && echo has-true"); out != "branch\nno-work\nhas-true\n" {
		t.Fatalf("sandbox after committing the branch from first: %q", out)
	}
	// second holds its changes since first: deleting first keeps its layer
	// for second, whose rollback is still exact, and frees the name.
	ctl("checkpoint", "rm", "sb", "first")
	if out := ctl("checkpoint", "ls", "sb"); strings.Contains(out, "first") || !strings.Contains(out, "(deleted)") {
		t.Fatalf("checkpoint ls after deleting first:\n%s", out)
	}
	ctl("rollback", "sb", "second")
	if out := sh("cat /state /work/a/f; test -e /bin/true || echo no-true"); out != "after\nx\nno-true\n" {
		t.Fatalf("sandbox after rollback to second, first deleted: %q", out)
	}
	ctl("checkpoint", "sb", "first")
	ctl("checkpoint", "rm", "sb", "second")
	if out := ctl("checkpoint", "ls", "sb", "--json"); strings.Contains(out, "second") || !strings.Contains(out, "first") {
		t.Fatalf("deleted checkpoint still listed: %s", out)
	}
}

// sandboxPid is the host pid of the sandbox's own init.
func sandboxPid(t *testing.T, sc *client.SandboxClient) string {
	t.Helper()
	nodes, err := sc.Tree(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == branch.RootID && n.InitPid > 0 {
			return strconv.Itoa(n.InitPid)
		}
	}
	t.Fatal("the sandbox has no init pid")
	return ""
}
