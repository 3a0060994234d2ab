//go:build linux

package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestContextsPause: while a sandbox is paused (containerd's task Pause,
// as nerdctl pause and ctr task pause do), every branch operation returns
// at once: fork, exec, commit, abort and kill of a branch process are
// refused with failed precondition naming the sandbox, the tree answers
// showing it paused, a checkpoint is made, a wait gives up when its caller
// does; nothing of any of them happens after the resume (same branches,
// parent's files unchanged, no commit applied, no process started). A
// Pause arriving while a fork is under way waits for it, and a fork and a
// commit whose callers gave up while they waited behind it do nothing; a
// fork whose caller gives up midway is undone. A sandbox frozen
// behind the shim's back (a write to its freezer, as runc pause does) is
// refused the same way. After the resume, fork and commit work. On the
// branch-init path and the runtime path.
func TestContextsPause(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"init", nil},
		{"runtime", []string{"--cap-add", "CAP_SYS_PTRACE"}},
	} {
		t.Run(tc.name, func(t *testing.T) { testPause(t, tc.extra) })
	}
}

// liveBranchIDs is the ids of the live branches of the sandbox's tree.
func liveBranchIDs(t *testing.T, ctx context.Context, sc *client.SandboxClient) []string {
	t.Helper()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatalf("tree: %v", err)
	}
	var ids []string
	for _, n := range nodes {
		if n.ID != branch.RootID && n.State == branch.Live {
			ids = append(ids, n.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

func testPause(t *testing.T, extra []string) {
	ctx, env, sc := sandboxCtxEnv(t, extra...)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 3})
	a, b, c := kids[0], kids[1], kids[2]
	mustRun(t, ctx, sc, b.ID, "sh", "-c", "echo from-b > /state")
	nested := fork(t, ctx, sc, client.ForkOptions{Count: 1, Parent: c.ID})[0]
	mustRun(t, ctx, sc, nested.ID, "sh", "-c", "echo from-nested > /state")
	// A process of a, for kill and wait while paused.
	sleeper, err := sc.Exec(ctx, a.ID, client.ExecOptions{Args: []string{"sleep", "100000"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sleeper.Close()

	cc, task := sandboxTask(t, ctx, env, "sb")
	// Runs before the sandbox's removal (cleanups run last first), so that
	// a failed test leaves nothing frozen.
	t.Cleanup(func() { _ = task.Resume(context.WithoutCancel(ctx)) })

	// A Pause while a fork is under way waits for it. The fork is held
	// in the snapshotter (stopped), with the sandbox locked; a fork and a
	// commit whose callers give up while they wait behind it must do
	// nothing once it is done.
	type result struct {
		kids []client.BranchInfo
		err  error
	}
	snap := env.SnapshotterPid()
	if err := syscall.Kill(snap, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumeSnap := func() { _ = syscall.Kill(snap, syscall.SIGCONT) }
	t.Cleanup(resumeSnap)
	// kill returns before every thread has stopped: one whose CPU is slow
	// to take the interrupt (a loaded VM) could still read the fork's
	// request off the socket, where it would be out of requestPending's
	// sight.
	waitUntil(t, "every thread of the snapshotter to stop", 10*time.Second, func() bool {
		return allStopped(t, snap)
	})
	bigFork := make(chan result, 1)
	go func() {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		k, err := sc.Fork(fctx, client.ForkOptions{Count: 2})
		bigFork <- result{k, err}
	}()
	waitUntil(t, "the fork to reach the stopped snapshotter", 10*time.Second, func() bool {
		return requestPending(t, env.SnapshotterAddress+branch.TTRPCSuffix)
	})
	quickFork, quickCommit := make(chan result, 1), make(chan error, 1)
	go func() {
		qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		k, err := sc.Fork(qctx, client.ForkOptions{Count: 1, Parent: a.ID})
		quickFork <- result{k, err}
	}()
	go func() {
		qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := sc.Commit(qctx, nested.ID)
		quickCommit <- err
	}()
	paused := make(chan error, 1)
	go func() { paused <- task.Pause(ctx) }()
	qf, qcErr := <-quickFork, <-quickCommit
	if qf.err == nil || qcErr == nil {
		t.Fatalf("a fork and a commit behind a fork held in the snapshotter answered: %v, %v; want them to time out", qf.err, qcErr)
	}
	select {
	case err := <-paused:
		t.Fatalf("pause returned (%v) while a fork was under way", err)
	case <-time.After(500 * time.Millisecond):
	}
	resumeSnap()
	select {
	case err := <-paused:
		if err != nil {
			t.Fatalf("pause: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("pause did not return within 20 s of the fork's end")
	}
	bf := <-bigFork
	if bf.err != nil {
		t.Fatalf("the fork under way when the pause came: %v", bf.err)
	}
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Paused {
		t.Fatalf("sandbox status after pause: %v %v", st.Status, err)
	}
	want := []string{a.ID, b.ID, c.ID, nested.ID}
	for _, k := range bf.kids {
		want = append(want, k.ID)
	}
	slices.Sort(want)

	wantPaused := func(what string, err error) {
		t.Helper()
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "sandbox sb is paused") {
			t.Errorf("%s on the paused sandbox: %v; want failed precondition, sandbox sb is paused", what, err)
		}
	}
	// quick runs op with a generous timeout and reports one that does not
	// return within a second.
	quick := func(what string, op func(ctx context.Context) error) error {
		t.Helper()
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		start := time.Now()
		err := op(qctx)
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s on the paused sandbox took %v; want under 1 s", what, d)
		}
		return err
	}
	wantPaused("fork", quick("fork", func(ctx context.Context) error {
		_, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
		return err
	}))
	wantPaused("fork of a branch", quick("fork of a branch", func(ctx context.Context) error {
		_, err := sc.Fork(ctx, client.ForkOptions{Count: 1, Parent: b.ID})
		return err
	}))
	wantPaused("exec", quick("exec", func(ctx context.Context) error {
		_, _, err := runErr(ctx, sc, a.ID, "touch", "/late")
		return err
	}))
	wantPaused("commit", quick("commit", func(ctx context.Context) error {
		_, err := sc.Commit(ctx, b.ID)
		return err
	}))
	wantPaused("commit of a nested branch", quick("commit of a nested branch", func(ctx context.Context) error {
		_, err := sc.Commit(ctx, nested.ID)
		return err
	}))
	wantPaused("abort", quick("abort", func(ctx context.Context) error {
		_, err := sc.Abort(ctx, a.ID)
		return err
	}))
	wantPaused("kill", quick("kill", func(ctx context.Context) error {
		return sleeper.Kill(ctx, uint32(syscall.SIGKILL))
	}))
	// A wait is a wait: it ends when its caller gives up.
	if err := quick("wait", func(ctx context.Context) error {
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := sleeper.Wait(wctx)
		return err
	}); !errors.Is(err, context.DeadlineExceeded) && !errdefs.IsDeadlineExceeded(err) {
		t.Errorf("wait with a 200 ms deadline for a process of the paused sandbox: %v; want deadline exceeded", err)
	}
	if err := quick("checkpoint", func(ctx context.Context) error {
		_, err := sc.Checkpoint(ctx, b.ID, "while-paused")
		return err
	}); err != nil {
		t.Errorf("checkpoint of a branch of the paused sandbox: %v", err)
	} else if err := quick("rollback", func(ctx context.Context) error {
		return sc.Rollback(ctx, b.ID, "while-paused")
	}); err != nil {
		t.Errorf("rollback of a branch of the paused sandbox to its checkpoint: %v", err)
	}
	var nodes []client.BranchInfo
	if err := quick("tree", func(ctx context.Context) (err error) {
		nodes, err = sc.Tree(ctx)
		return err
	}); err != nil {
		t.Fatalf("tree of the paused sandbox: %v", err)
	}
	for _, n := range nodes {
		if n.State == branch.Live && n.Status != "paused" {
			t.Errorf("branch %s of the paused sandbox has status %q, want paused", n.ID, n.Status)
		}
	}
	if out, errOut, code := branchctl(t, ctx, env, "", "tree", "sb"); code != 0 || !strings.Contains(out, "PAUSED: sb") {
		t.Errorf("branchctl tree of the paused sandbox: %d %s %s; want it shown paused", code, out, errOut)
	}
	if _, stderr, code := ctrExit(ctx, env, "tasks", "exec", "--exec-id", "late", "sb", "touch", "/late"); code == 0 || !strings.Contains(stderr, "paused") {
		t.Errorf("ctr tasks exec in the paused sandbox: exit %d %s; want refused, paused", code, stderr)
	}
	// containerd's client refuses to delete a paused task itself; its task
	// service passes the delete to the shim, which must not end the
	// branches of a sandbox it cannot delete.
	_, err = cc.TaskService().Delete(ctx, &tasks.DeleteTaskRequest{ContainerID: "sb"})
	wantPaused("delete of the task", errgrpc.ToNative(err))

	if err := task.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	// Whatever was refused or given up must not happen now.
	time.Sleep(500 * time.Millisecond)
	if got := liveBranchIDs(t, ctx, sc); !slices.Equal(got, want) {
		t.Errorf("live branches after the resume: %v, want %v", got, want)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "before\n" {
		t.Errorf("sandbox /state after the resume: %q %v; want before (no commit applied)", out, err)
	}
	if out := mustRun(t, ctx, sc, c.ID, "cat", "/state"); out != "before\n" {
		t.Errorf("a commit whose caller gave up (%v) was applied: its parent's /state is %q", qcErr, out)
	}
	if out, code := run(t, ctx, sc, a.ID, "test", "-e", "/late"); code == 0 {
		t.Errorf("/late exists in %s after the resume: an exec refused while paused ran: %s", a.ID, out)
	}
	if err := sleeper.Kill(ctx, uint32(syscall.SIGKILL)); err != nil {
		t.Errorf("kill after the resume: %v", err)
	} else if st, err := sleeper.Wait(ctx); err != nil || st.Code != 137 {
		t.Errorf("wait after the resume: %+v %v", st, err)
	}

	// Frozen behind the shim's back, as runc pause does: refused the same.
	thawBehind := freezeBehind(t, env)
	wantPaused("fork of a sandbox frozen outside containerd", quick("fork of a sandbox frozen outside containerd", func(ctx context.Context) error {
		_, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
		return err
	}))
	wantPaused("commit in a sandbox frozen outside containerd", quick("commit in a sandbox frozen outside containerd", func(ctx context.Context) error {
		_, err := sc.Commit(ctx, b.ID)
		return err
	}))
	thawBehind()
	if got := liveBranchIDs(t, ctx, sc); !slices.Equal(got, want) {
		t.Errorf("live branches after the thaw: %v, want %v", got, want)
	}

	// A fork whose caller gives up midway leaves no branch behind: in the
	// shim (a 20 ms deadline), or while the snapshotter holds it (stopped),
	// which makes the branches once it runs again.
	giveUp := func(what string, timeout time.Duration) {
		t.Helper()
		fctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		made, err := sc.Fork(fctx, client.ForkOptions{Count: 4, Parent: c.ID})
		if err == nil {
			for _, k := range made {
				want = append(want, k.ID)
			}
			slices.Sort(want)
			return
		}
		time.Sleep(2 * time.Second) // the snapshotter runs again after 1 s
		if got := liveBranchIDs(t, ctx, sc); !slices.Equal(got, want) {
			t.Errorf("live branches after a fork whose caller gave up %s (%v): %v, want %v", what, err, got, want)
		}
	}
	giveUp("in the shim", 20*time.Millisecond)
	if err := syscall.Kill(snap, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(time.Second); resumeSnap() }()
	giveUp("while the snapshotter held it", 300*time.Millisecond)

	// Everything works again.
	again := fork(t, ctx, sc, client.ForkOptions{Count: 1, Parent: b.ID})
	if _, err := sc.Abort(ctx, again[0].ID); err != nil {
		t.Fatalf("abort after the resume: %v", err)
	}
	if _, err := sc.Commit(ctx, b.ID); err != nil {
		t.Fatalf("commit after the resume: %v", err)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "from-b\n" {
		t.Fatalf("sandbox /state after the commit: %q %v", out, err)
	}
}

// freezeBehind freezes the sandbox's cgroup directly, as runc pause does
// without containerd knowing, and returns what thaws it (also run at
// cleanup).
func freezeBehind(t *testing.T, env *daemons.Env) func() {
	t.Helper()
	var file, frozen, thawed string
	for _, d := range containerCgroupDirs(env.Namespace, "sb") {
		if _, err := os.Stat(filepath.Join(d, "freezer.state")); err == nil {
			file, frozen, thawed = filepath.Join(d, "freezer.state"), "FROZEN", "THAWED"
			break
		}
		if _, err := os.Stat(filepath.Join(d, "cgroup.freeze")); err == nil && file == "" {
			file, frozen, thawed = filepath.Join(d, "cgroup.freeze"), "1", "0"
		}
	}
	if file == "" {
		t.Fatal("no freezer for the sandbox's cgroup")
	}
	thaw := func() {
		if err := os.WriteFile(file, []byte(thawed), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("thaw %s: %v", file, err)
		}
	}
	t.Cleanup(thaw)
	if err := os.WriteFile(file, []byte(frozen), 0); err != nil {
		t.Fatalf("freeze %s: %v", file, err)
	}
	return thaw
}

// TestContextsPauseShimDeath: a shim killed while its sandbox is paused
// leaves nothing of the branches: containerd's cleanup (the shim binary's
// delete) kills them although the frozen sandbox keeps them frozen.
func TestContextsPauseShimDeath(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	daemon := `setsid sh -c 'trap "" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 & echo started`
	var procs []hostProc
	for _, k := range kids {
		if out := mustRun(t, ctx, sc, k.ID, "sh", "-c", daemon); !strings.Contains(out, "started") {
			t.Fatalf("daemon in %s: %q", k.ID, out)
		}
		procs = append(procs, branchProcs(env, k)...)
	}
	_, task := sandboxTask(t, ctx, env, "sb")
	procs = append(procs, containerHostProcs(env.Namespace, "sb", int(task.Pid()))...)
	t.Cleanup(func() { _ = task.Resume(context.WithoutCancel(ctx)) })
	if err := task.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	shim := shimOf(t, env, "sb")
	sockets := existing(env.ShimSockets(shim))
	t.Cleanup(func() { removeFiles(sockets) })
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitUntil(t, "containerd to clean up after the dead shim", 20*time.Second, func() bool {
		return len(survivors(procs)) == 0 && len(containerCgroupDirs(env.Namespace, "sb")) == 0
	})
	t.Logf("cleanup after the shim of a paused sandbox died: %v", time.Since(start))
	for _, k := range kids {
		assertBranchGone(t, env, k, nil)
	}
	removeContainer(t, env, "sb")
	assertContainerGone(t, env, "sb", procs)
}

// TestContextsExecFrozenBranch: exec into a branch whose processes are
// frozen for its own branches (--seal freeze), its init among them, is
// refused at once rather than waiting for the thaw and running after its
// caller gave up; once its branch is aborted, exec works again.
func TestContextsExecFrozenBranch(t *testing.T) {
	ctx, _, sc := sandboxCtxEnv(t)
	a := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1, Parent: a.ID, Seal: "freeze"})[0]
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := runErr(qctx, sc, a.ID, "touch", "/late")
	if d := time.Since(start); d > time.Second {
		t.Errorf("exec into a frozen branch took %v; want under 1 s", d)
	}
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "frozen") {
		t.Errorf("exec into a frozen branch: %v; want failed precondition, frozen", err)
	}
	if _, err := sc.Abort(ctx, kid.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if out, code := run(t, ctx, sc, a.ID, "test", "-e", "/late"); code == 0 {
		t.Errorf("/late exists in %s after the thaw: the exec refused while it was frozen ran: %s", a.ID, out)
	}
}

// allStopped reports whether every thread of pid is stopped by a signal.
func allStopped(t *testing.T, pid int) bool {
	t.Helper()
	stats, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "stat"))
	if err != nil || len(stats) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// requestPending says whether the unix socket at path has a connection
// its server has not accepted, or one holding bytes it has not read
// (Recv-Q in ss, of the listener or of the connection): a request that
// reached a stopped daemon.
func requestPending(t *testing.T, path string) bool {
	t.Helper()
	out, err := exec.Command("ss", "-xan").Output()
	if err != nil {
		t.Fatalf("ss -xn: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		// Netid State Recv-Q Send-Q Local-Address Port Peer-Address Port
		if f := strings.Fields(l); len(f) >= 5 && f[4] == path && f[2] != "0" {
			return true
		}
	}
	return false
}
