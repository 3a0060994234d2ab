//go:build linux

package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
)

// TestContextsSandboxStop: when a sandbox's init is killed (ctr task kill,
// as nerdctl stop does), every branch of it dies with it, a setsid daemon
// ignoring SIGTERM included, by the time a Wait for the init returns;
// branch operations on the stopped sandbox fail with failed precondition;
// a new task of the same container forks again; and deleting it leaves
// nothing of its branches. On the branch-init path and the runtime path
// (CAP_SYS_PTRACE keeps a branch off the init).
func TestContextsSandboxStop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"init", nil},
		{"runtime", []string{"--cap-add", "CAP_SYS_PTRACE"}},
	} {
		t.Run(tc.name, func(t *testing.T) { testSandboxStop(t, tc.extra) })
	}
}

func testSandboxStop(t *testing.T, extra []string) {
	ctx, env, sc := sandboxCtxEnv(t, extra...)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	nested := fork(t, ctx, sc, client.ForkOptions{Count: 1, Parent: kids[0].ID})
	all := append(kids, nested...)
	daemon := `setsid sh -c 'trap "" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 & echo started`
	var procs [][]hostProc
	for _, k := range all {
		if out := mustRun(t, ctx, sc, k.ID, "sh", "-c", daemon); !strings.Contains(out, "started") {
			t.Fatalf("daemon in %s: %q", k.ID, out)
		}
		ps := branchProcs(env, k)
		if len(ps) < 2 {
			t.Fatalf("branch %s: processes seen from the host %v; want its init and the daemon", k.ID, ps)
		}
		procs = append(procs, ps)
	}

	_, task := sandboxTask(t, ctx, env, "sb")
	exitCh, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := ctrExit(ctx, env, "tasks", "kill", "-s", "SIGKILL", "sb"); code != 0 {
		t.Fatalf("ctr tasks kill: %s", stderr)
	}
	select {
	case st := <-exitCh:
		if st.ExitCode() != 137 {
			t.Fatalf("sandbox exit %d, want 137", st.ExitCode())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sandbox did not exit within 30 s of SIGKILL")
	}
	// The Wait returned: nothing of any branch may be alive now.
	for i, k := range all {
		if left := append(survivors(procs[i]), branchProcs(env, k)...); len(left) != 0 {
			t.Errorf("branch %s: processes alive after the sandbox's exit was reported: %v", k.ID, left)
		}
	}
	for i, k := range all {
		assertBranchGone(t, env, k, procs[i])
	}

	wantStopped := func(what string, err error) {
		t.Helper()
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "sandbox sb is stopped") {
			t.Errorf("%s on the stopped sandbox: %v; want failed precondition, sandbox sb is stopped", what, err)
		}
	}
	_, err = sc.Fork(ctx, client.ForkOptions{Count: 1})
	wantStopped("fork", err)
	_, err = sc.Fork(ctx, client.ForkOptions{Count: 1, Parent: kids[1].ID})
	wantStopped("fork of a branch", err)
	_, _, err = runErr(ctx, sc, kids[1].ID, "true")
	wantStopped("exec", err)
	_, err = sc.Commit(ctx, kids[1].ID)
	wantStopped("commit", err)
	_, err = sc.Abort(ctx, kids[1].ID)
	wantStopped("abort", err)
	_, err = sc.Checkpoint(ctx, kids[1].ID, "c1")
	wantStopped("checkpoint", err)
	if t.Failed() {
		return
	}

	// A new task of the same container forks fine.
	if _, err := env.Ctr(ctx, "tasks", "delete", "sb"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "tasks", "start", "-d", "sb"); err != nil {
		t.Fatal(err)
	}
	// As sandboxCtxEnv: its shell has written /state and exec'd sleep, so
	// no file of the rootfs is still open for writing by a process gone
	// before the fork could freeze it.
	waitFor(t, func() bool { out, _ := execIn(ctx, env, "sb", "cat", "/state"); return out == "before\n" })
	sc2, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "sb")
	if err != nil {
		t.Fatal(err)
	}
	defer sc2.Close()
	again := fork(t, ctx, sc2, client.ForkOptions{Count: 1})
	if got := mustRun(t, ctx, sc2, again[0].ID, "cat", "/state"); got != "before\n" {
		t.Fatalf("branch of the new task sees /state %q", got)
	}
	mustRun(t, ctx, sc2, again[0].ID, "sh", "-c", daemon)
	againProcs := branchProcs(env, again[0])

	// Deleting the task (kill, then delete) leaves nothing of it.
	removeContainer(t, env, "sb")
	assertBranchGone(t, env, again[0], againProcs)
	assertContainerGone(t, env, "sb", nil)
}
