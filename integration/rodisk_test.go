//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fstest"
)

// TestReadOnlyDisk: the node's disk (containerd's and the snapshotter's
// roots) turns read-only under a sandbox with live branches, as ext4
// does after an error with errors=remount-ro. Forks, a memory fork,
// checkpoints, a commit and an abort are refused as failed preconditions
// that say the snapshotter's storage is read-only, naming none of its
// directories (before: "mkdir <root>/branches/2/3: read-only file
// system"). The commit's winner is not left frozen: bolt kept its
// mapping, so the tree could still be read and the commit's outcome known
// (before, the branch database's new mapping failed, bolt failed every
// later call, "database isn't correctly mapped", and the winner stayed
// frozen "until the snapshotter answers"). The tree is shown. After a
// reboot with the disk repaired, the sandbox starts with what was
// committed and forks and commits again, and the checkpoint taken just
// before the error rolls back: a checkpoint is written to disk before it
// is acknowledged (before, its record and files were lost with the page
// cache: "no checkpoint named c0").
func TestReadOnlyDisk(t *testing.T) {
	ctx, env, mnt := sandboxOnDisk(t, 256)
	bc := func(args ...string) string {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: %d %q %q", args, code, out, errOut)
		}
		return out
	}
	refused := func(what string, args ...string) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code == 0 || !strings.Contains(errOut, "failed precondition") || !strings.Contains(errOut, "storage under "+env.SnapshotterRoot+" is read-only") ||
			strings.Contains(errOut, env.SnapshotterRoot+"/") {
			t.Errorf("%s on a read-only disk: %d %q %q; want failed precondition, the storage read-only, no directory of the snapshotter's", what, code, out, errOut)
		}
	}
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo kept > /kept"); err != nil {
		t.Fatal(err)
	}
	bc("fork", "sb", "-n", "2")
	bc("exec", "sb/1", "--", "sh", "-c", "echo won > /winner")
	bc("checkpoint", "sb", "c0")
	fstest.ErrorLoopExt4(t, mnt)

	refused("fork", "fork", "sb/1")
	refused("memory fork", "fork", "sb", "--memory")
	refused("checkpoint", "checkpoint", "sb", "c1")
	refused("commit", "commit", "sb/1")
	refused("abort", "abort", "sb/2")
	var tree []client.BranchInfo
	if err := json.Unmarshal([]byte(bc("--json", "tree", "sb")), &tree); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, n := range tree {
		if n.ID == "1" {
			found = true
			if n.State != "live" || n.Status != "waiting" {
				t.Errorf("the commit's winner after its refusal: %+v, want live and its init waiting, not frozen", n)
			}
		}
	}
	if !found {
		t.Errorf("the commit's winner is not in the tree: %+v", tree)
	}
	if out := bc("exec", "sb/1", "--", "cat", "/winner"); out != "won\n" {
		t.Errorf("the winner after its refused commit: %q", out)
	}
	if _, err := execIn(ctx, env, "sb", "true"); err != nil {
		t.Errorf("the sandbox on a read-only disk: %v", err)
	}

	if err := env.PowerCut(); err != nil {
		t.Fatal(err)
	}
	fstest.RepairLoopExt4(t, mnt)
	if err := env.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	startAgain(t, ctx, env, "sb")
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "ls /winner 2>&1 || true"); !strings.Contains(out, "No such file") {
		t.Errorf("the sandbox after the reboot: %q %v; want no /winner (its commit was refused)", out, err)
	}
	bc("fork", "sb")
	bc("exec", "sb/3", "--", "sh", "-c", "echo won > /winner")
	bc("commit", "sb/3")
	if out, err := execIn(ctx, env, "sb", "cat", "/winner"); err != nil || out != "won\n" {
		t.Errorf("the sandbox after a commit on the repaired disk: %q %v", out, err)
	}
	// The checkpoint taken just before the disk's error was on disk.
	bc("rollback", "sb", "c0")
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "cat /kept; ls /winner 2>&1 || true"); !strings.HasPrefix(out, "kept\n") || !strings.Contains(out, "No such file") {
		t.Errorf("the sandbox rolled back to c0: %q %v; want /kept and no /winner", out, err)
	}
}

// startAgain starts a new task of container id, whose last one a reboot
// ended, as `nerdctl start` does.
func startAgain(t *testing.T, ctx context.Context, env *daemons.Env, id string) {
	t.Helper()
	cc, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctr, err := cc.LoadContainer(ctx, id)
	if err != nil {
		t.Fatalf("container %s after the reboot: %v", id, err)
	}
	if task, err := ctr.Task(ctx, nil); err == nil {
		st, _ := task.Status(ctx)
		t.Fatalf("container %s has a task after the reboot: %s", id, st.Status)
	}
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatalf("start %s again after the reboot: %v", id, err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start %s again after the reboot: %v", id, err)
	}
}
