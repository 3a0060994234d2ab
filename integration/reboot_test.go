//go:build linux

package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestNodeReboot cuts the node's power under a sandbox with committed
// work, checkpoints, live branches with processes and a nested branch,
// and boots it (daemons.Env.Reboot: every process killed, mounts, cgroups
// and /run's state gone, the disks kept). The sandbox then starts again
// as `nerdctl start` starts it: with what was committed, not what its
// branches held; its checkpoints roll back; it forks; the branches that
// were live are not live any more and their storage is reclaimed; and
// nothing is left once it is removed.
// The same with a sandbox in a user namespace of its own, whose branches'
// view of the image (an id-mapped bind) the reboot drops too.
func TestNodeReboot(t *testing.T) {
	m := fmt.Sprintf("0:%d:%d", usernsHost, usernsSize)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"plain", nil},
		{"userns", []string{"--uidmap", m, "--gidmap", m}},
	} {
		t.Run(tc.name, func(t *testing.T) { testNodeReboot(t, tc.flags) })
	}
}

func testNodeReboot(t *testing.T, flags []string) {
	ctx, env, _ := shimEnv(t)
	// The init holds a value in its memory alone (a new one at each
	// start) and shows it in /tmp/alive.
	sc := runSandboxWith(t, ctx, env, flags, ociimage.ImageRef, "sh", "-c",
		`v=$RANDOM$RANDOM; while :; do echo $v > /tmp/alive; sleep 0.05; done`)
	sh := func(sc *client.SandboxClient, b, script string) string {
		t.Helper()
		return mustRun(t, ctx, sc, b, "sh", "-c", script)
	}
	rootSh := func(script string) string {
		t.Helper()
		out, err := execIn(ctx, env, "sb", "sh", "-c", script)
		if err != nil {
			t.Fatalf("%s in the sandbox: %v", script, err)
		}
		return out
	}
	commitOne := func(sc *client.SandboxClient, script string) {
		t.Helper()
		k := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
		sh(sc, k.ID, script)
		if _, err := sc.Commit(ctx, k.ID); err != nil {
			t.Fatalf("commit %s: %v", k.ID, err)
		}
	}
	var held string
	waitFor(t, func() bool { held, _ = execIn(ctx, env, "sb", "cat", "/tmp/alive"); return held != "" })
	commitOne(sc, "echo v1 > /data")
	if _, err := sc.Checkpoint(ctx, "", "cp1"); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Checkpoint(ctx, "", "mem", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	commitOne(sc, "echo v2 > /data; mkdir -p /work && echo kept > /work/f")
	live := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	var running []*client.Process
	for _, k := range live {
		sh(sc, k.ID, "echo "+k.ID+" > /data; dd if=/dev/zero of=/big bs=1M count=4 2>/dev/null")
		p, err := sc.Exec(ctx, k.ID, client.ExecOptions{Args: []string{"sleep", "100000"}})
		if err != nil {
			t.Fatal(err)
		}
		running = append(running, p)
	}
	nested := fork(t, ctx, sc, client.ForkOptions{Parent: live[0].ID, Count: 1})[0]
	sh(sc, nested.ID, "echo nested > /data")
	if _, err := sc.Checkpoint(ctx, live[1].ID, "in-branch"); err != nil {
		t.Fatal(err)
	}
	sc.Close()

	if err := env.Reboot(ctx); err != nil {
		t.Fatalf("reboot: %v", err)
	}
	// Their FIFOs, under the host's /run/containerd/fifo, which a real
	// reboot empties.
	for _, p := range running {
		p.Close()
	}

	startAgain(t, ctx, env, "sb")
	sc = sandboxClient(t, ctx, env, "sb")
	if got := rootSh("cat /data /work/f; ls /big 2>&1 || true"); !strings.HasPrefix(got, "v2\nkept\n") || !strings.Contains(got, "No such file") {
		t.Errorf("sandbox after the reboot: /data, /work/f, /big = %q, want the committed v2 and kept and no /big", got)
	}
	rootSh("echo writable > /after")
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range tree {
		if n.ID != "0" && n.State == branch.Live {
			t.Errorf("branch %s is live after the reboot: %+v", n.ID, n)
		}
	}
	if l := liveInSnapshotter(t, ctx, env, "sb"); len(l) != 0 {
		t.Errorf("the snapshotter has live branches after the reboot: %v", l)
	}
	for _, k := range append(live, nested) {
		if _, err := sc.Exec(ctx, k.ID, client.ExecOptions{Args: []string{"true"}}); err == nil {
			t.Errorf("exec in branch %s, live before the reboot, succeeded after it", k.ID)
		}
	}
	cks, err := sc.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cks) != 2 || cks[0].Name != "cp1" || cks[1].Name != "mem" {
		t.Errorf("checkpoints after the reboot: %+v, want the sandbox's cp1 and mem (in-branch went with its branch)", cks)
	}
	k := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	// Owners as the sandbox's root sees them: in a user namespace, through
	// the branch's id-mapped view of the image, made again after the boot.
	if got := sh(sc, k.ID, "cat /data /after; stat -c %u:%g /bin/busybox /after"); got != "v2\nwritable\n0:0\n0:0\n" {
		t.Errorf("fork after the reboot sees %q", got)
	}
	if _, err := sc.Abort(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if err := sc.Rollback(ctx, "", "cp1"); err != nil {
		t.Fatalf("rollback to cp1 after the reboot: %v", err)
	}
	if got := rootSh("cat /data; ls /work 2>&1 || true"); !strings.HasPrefix(got, "v1\n") {
		t.Errorf("after rollback to cp1: %q, want v1", got)
	}
	// The processes of the memory checkpoint come back in place of the
	// init started after the boot, with the value they held.
	var now string
	waitFor(t, func() bool { now, _ = execIn(ctx, env, "sb", "cat", "/tmp/alive"); return now != "" && now != held })
	if err := sc.Rollback(ctx, "", "mem"); err != nil {
		t.Fatalf("rollback to a checkpoint with memory after the reboot: %v", err)
	}
	// The checkpoint's files hold the value too: the process must write
	// it again.
	rootSh("rm /tmp/alive")
	var got string
	waitFor(t, func() bool { got, _ = execIn(ctx, env, "sb", "cat", "/tmp/alive"); return got != "" })
	if data := rootSh("cat /data"); got != held || data != "v1\n" {
		t.Errorf("after rollback to the memory checkpoint: the process writes %q, /data %q; want %q (held before the reboot; %q after it) and v1", got, data, held, now)
	}
	// The storage of the branches live at the reboot, and of the
	// checkpoint of one of them, is reclaimed.
	var layers, ckDirs []string
	for _, d := range walkDirs(env.SnapshotterRoot) {
		rel, _ := filepath.Rel(env.SnapshotterRoot, d)
		switch parts := strings.Split(rel, "/"); {
		case len(parts) == 3 && parts[0] == "branches":
			layers = append(layers, rel)
		case len(parts) == 3 && parts[0] == "checkpoints":
			ckDirs = append(ckDirs, rel)
		}
	}
	if len(layers) != 0 {
		t.Errorf("branch layers left after the reboot: %v", layers)
	}
	if len(ckDirs) != len(cks) {
		t.Errorf("checkpoint directories after the reboot: %v, want one for each of %d checkpoints", ckDirs, len(cks))
	}
	// And its removal leaves nothing of it (containerd's collector
	// removes the snapshot a little after the container).
	removeContainer(t, env, "sb")
	var left []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		left = nil
		for _, d := range []string{"checkpoints", "branches", "snapshots"} {
			sub, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, d, "*", "*"))
			left = append(left, sub...)
		}
		if len(left) <= 2 { // the image's layer: snapshots/1/{fs,work}
			break
		}
	}
	if len(left) > 2 {
		t.Errorf("storage left after the sandbox's removal: %v", left)
	}
	if m, _ := daemons.MountsUnder(env.Dir); len(m) != 0 {
		t.Errorf("mounts left after the sandbox's removal: %v", m)
	}
}
