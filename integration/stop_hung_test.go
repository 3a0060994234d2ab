//go:build linux

package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client"
)

// TestSandboxStopSnapshotterHung stops a sandbox (SIGKILL of its init, as
// nerdctl stop and the kubelet do) while the snapshotter is alive but does
// not answer (SIGSTOP: as one blocked on a failing disk), with no branch
// operation under way ("idle") and with a fork waiting for the
// snapshotter ("fork") or its commit ("commit"), whose winner is frozen meanwhile. The branches' processes must die at once
// and the Wait for the init must return, not wait for the snapshotter:
// before, the stop hung until the snapshotter answered, the branches'
// processes ran on meanwhile, and the shim published no event of any of
// its containers. Once the snapshotter answers again, the task's delete
// leaves no branch live there, no cgroup and no process, and a commit
// it acknowledged is in the sandbox's next task.
func TestSandboxStopSnapshotterHung(t *testing.T) {
	for _, waiting := range []string{"idle", "fork", "commit"} {
		t.Run(waiting, func(t *testing.T) { testStopSnapshotterHung(t, waiting) })
	}
}

func testStopSnapshotterHung(t *testing.T, waiting string) {
	ctx, env, sc := sandboxCtxEnv(t)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	var procs []hostProc
	for _, k := range kids {
		procs = append(procs, startDaemon(t, ctx, env, sc, k, "hung-"+k.ID)...)
	}
	cc, task := sandboxTask(t, ctx, env, "sb")
	exitCh, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	evctx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	exits, evErrs := cc.EventService().Subscribe(evctx, `topic=="/tasks/exit"`)

	pid := env.SnapshotterPid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)

	opErr := make(chan error, 1)
	switch waiting {
	case "fork":
		go func() {
			_, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
			opErr <- err
		}()
	case "commit":
		mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "echo won > /won")
		go func() {
			_, err := sc.Commit(ctx, kids[0].ID)
			opErr <- err
		}()
	}
	if waiting != "idle" {
		// It holds the sandbox while it waits for the snapshotter.
		time.Sleep(time.Second)
	}
	start := time.Now()
	if _, stderr, code := ctrExit(ctx, env, "tasks", "kill", "-s", "SIGKILL", "sb"); code != 0 {
		t.Fatalf("ctr tasks kill: %s", stderr)
	}
	waitUntil(t, "the branches' processes to die with the snapshotter stopped", 5*time.Second, func() bool {
		return len(survivors(procs)) == 0
	})
	select {
	case st := <-exitCh:
		if st.ExitCode() != 137 {
			t.Fatalf("sandbox exit %d, want 137", st.ExitCode())
		}
		t.Logf("the sandbox's exit was reported %v after its kill, the snapshotter stopped", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox's exit was not reported within 30 s of its kill with the snapshotter stopped")
	}
	// containerd hears of it too: the shim's events (of every container
	// it serves) are not held up.
	select {
	case <-exits:
	case err := <-evErrs:
		t.Fatalf("containerd's events: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("containerd got no /tasks/exit event within 10 s of the reported exit")
	}
	for _, k := range kids {
		if left := branchProcs(env, k); len(left) != 0 {
			t.Errorf("branch %s: processes alive after the sandbox's exit was reported: %v", k.ID, left)
		}
	}

	resume()
	committed := false
	if waiting != "idle" {
		select {
		case err := <-opErr:
			committed = waiting == "commit" && err == nil
			// Either is right: done before the kill reached it (a fork's
			// branch then ended with the rest), or undone.
			t.Logf("the %s waiting for the snapshotter: %v", waiting, err)
		case <-time.After(90 * time.Second):
			t.Fatalf("the %s did not return within 90 s of the snapshotter's resumption", waiting)
		}
	}
	for _, k := range kids {
		assertBranchGone(t, env, k, nil)
	}
	waitUntil(t, "no live branch of sb in the snapshotter", 20*time.Second, func() bool {
		return len(liveInSnapshotter(t, ctx, env, "sb")) == 0
	})
	delCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := env.Ctr(delCtx, "tasks", "delete", "sb"); err != nil && !strings.Contains(out+err.Error(), "not found") {
		t.Fatalf("ctr tasks delete: %s %v", out, err)
	}
	if dirs, pids := branchCgroupsOf(env.Namespace, "sb"); len(dirs) != 0 || len(pids) != 0 {
		t.Fatalf("branch cgroups left: %v (processes %v)", dirs, pids)
	}
	if committed {
		// An acknowledged commit is in the sandbox's rootfs: a new task
		// of it sees the winner's file.
		if _, err := env.Ctr(ctx, "tasks", "start", "-d", "sb"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { out, _ := execIn(ctx, env, "sb", "cat", "/won"); return out == "won\n" })
	}
}
