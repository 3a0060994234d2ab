//go:build linux

package integration

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/shim/ocirt"
)

// watchedTask is the containerd task of the REPL sandbox, with a Wait on
// it started and the task events about it recorded from now on.
type watchedTask struct {
	c      containerd.Container
	task   containerd.Task
	exit   <-chan containerd.ExitStatus
	mu     sync.Mutex
	events []string
}

func watchSandboxTask(t *testing.T, ctx context.Context, env *daemons.Env) *watchedTask {
	t.Helper()
	cc, err := containerd.New(env.Address, containerd.WithDefaultNamespace(env.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	c, err := cc.LoadContainer(ctx, "sb")
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A Wait that outlives the test's calls: containerd's and the
	// kubelet's watch of the task.
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	exit, err := task.Wait(wctx)
	if err != nil {
		t.Fatal(err)
	}
	st := &watchedTask{c: c, task: task, exit: exit}
	msgs, errs := cc.Subscribe(wctx, `topic~="^/tasks/"`)
	go func() {
		for {
			select {
			case m := <-msgs:
				v, err := typeurl.UnmarshalAny(m.Event)
				if err != nil {
					continue
				}
				id := ""
				switch e := v.(type) {
				case *eventstypes.TaskExit:
					if e.ID == e.ContainerID {
						id = e.ContainerID
					}
				case *eventstypes.TaskDelete:
					id = e.ContainerID
				case *eventstypes.TaskCreate:
					id = e.ContainerID
				case *eventstypes.TaskStart:
					id = e.ContainerID
				}
				if id == "sb" {
					st.mu.Lock()
					st.events = append(st.events, m.Topic)
					st.mu.Unlock()
				}
			case <-errs:
				return
			}
		}
	}()
	return st
}

func (st *watchedTask) seen() []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]string(nil), st.events...)
}

// assertRunsOn fails if the task was seen to end, by its Wait, its status
// or an event.
func (st *watchedTask) assertRunsOn(t *testing.T, ctx context.Context, what string) uint32 {
	t.Helper()
	select {
	case e := <-st.exit:
		t.Fatalf("%s: the sandbox's task was seen to exit (%d)", what, e.ExitCode())
	default:
	}
	s, err := st.task.Status(ctx)
	if err != nil || s.Status != containerd.Running {
		t.Fatalf("%s: the sandbox's task is %+v %v, want running", what, s, err)
	}
	if ev := st.seen(); len(ev) > 0 {
		t.Fatalf("%s: containerd published %v about the sandbox's task", what, ev)
	}
	ps, err := st.task.Pids(ctx)
	if err != nil || len(ps) == 0 {
		t.Fatalf("%s: the task's processes: %v %v", what, ps, err)
	}
	// Loaded again: a Task caches the pid it was loaded with.
	task, err := st.c.Task(ctx, nil)
	if err != nil {
		t.Fatalf("%s: load the task: %v", what, err)
	}
	return task.Pid()
}

// TestMemoryRollbackSandbox rolls the sandbox itself back to a checkpoint
// taken with its processes: they are killed and the checkpoint's restored
// as the same task, which containerd, and a Wait on it, see run on. The
// REPL is where it was, its files the checkpoint's; execs, forks, a second
// rollback and the task's end work as before.
func TestMemoryRollbackSandbox(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=saved; echo saved >&3`)
	if _, err := sc.Checkpoint(ctx, "", "s1", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 1, `mem=changed; echo changed >&3; echo $mem`); got != "changed\n" {
		t.Fatalf("sandbox after its checkpoint: %q", got)
	}
	st := watchSandboxTask(t, ctx, env)
	pid0 := st.task.Pid()
	before := containerHostProcs(env.Namespace, "sb", int(pid0))
	if len(before) == 0 {
		t.Fatal("the sandbox's processes are not seen from the host")
	}
	if err := sc.Rollback(ctx, "", "s1"); err != nil {
		t.Fatalf("rollback of the sandbox to a checkpoint with memory: %v", err)
	}
	for _, p := range before {
		if procAlive(p) {
			t.Fatalf("process %v of the sandbox before the rollback still runs", p)
		}
	}
	pid1 := st.assertRunsOn(t, ctx, "after the rollback")
	if pid1 == pid0 {
		t.Fatalf("the task's pid is still the old init's (%d)", pid0)
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 1, `echo "mem=$mem k=$k"`); got != "mem=saved k=1\n" {
		t.Fatalf("sandbox after the rollback continues with %q, want the checkpoint's state (mem=saved k=1)", got)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/data.log"); err != nil || out != "before\nsaved\n" {
		t.Fatalf("sandbox after the rollback: /data.log %q %v, want the checkpoint's", out, err)
	}
	if _, err := os.Lstat(filepath.Join(sandboxBundle(env), ocirt.KeptNetNSFile)); !os.IsNotExist(err) {
		t.Fatalf("the kept network namespace is left in the bundle: %v", err)
	}
	// Branches work on the restored sandbox: a fork (its inits started
	// anew in the new processes' namespaces) and a commit.
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "echo forked >> /data.log")
	if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 2, `mem=third; cat /data.log`); got != "before\nsaved\nforked\n" {
		t.Fatalf("sandbox after a commit on its restored processes: %q", got)
	}
	// Again, from a state that moved on.
	if err := sc.Rollback(ctx, "", "s1"); err != nil {
		t.Fatalf("second rollback: %v", err)
	}
	st.assertRunsOn(t, ctx, "after the second rollback")
	if got := replIn(t, ctx, env, sc, branch.RootID, 1, `echo "mem=$mem k=$k"; cat /data.log`); got != "mem=saved k=1\nbefore\nsaved\n" {
		t.Fatalf("sandbox after the second rollback: %q", got)
	}
	assertNoMemoryImages(t, env)
	// Its end is the restored init's, seen by the Wait started before.
	if err := st.task.Kill(ctx, 9); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-st.exit:
		if e.ExitCode() != 137 {
			t.Fatalf("exit of the restored sandbox: %d, want 137", e.ExitCode())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the Wait started before the rollbacks never returned after a kill")
	}
	if _, err := st.task.Delete(ctx); err != nil {
		t.Fatalf("delete of the restored sandbox's task: %v", err)
	}
}

// TestMemoryRollbackSandboxRefused: a rollback of the sandbox with its
// processes that cannot be done is refused before anything changes.
func TestMemoryRollbackSandboxRefused(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=saved`)
	if _, err := sc.Checkpoint(ctx, "", "s1", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	replIn(t, ctx, env, sc, branch.RootID, 1, `mem=changed`)
	st := watchSandboxTask(t, ctx, env)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	err := sc.Rollback(ctx, "", "s1")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "live children ("+kids[0].ID+")") {
		t.Fatalf("rollback of a sandbox with a live branch: %v; want failed precondition naming it", err)
	}
	if _, err := sc.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	st.assertRunsOn(t, ctx, "after a refused rollback")
	if got := replIn(t, ctx, env, sc, branch.RootID, 2, `echo $mem`); got != "changed\n" {
		t.Fatalf("sandbox after a refused rollback: %q", got)
	}
}

// TestMemoryRollbackSandboxFails: a restore that fails (the checkpoint's
// memory pages lost), or never ends (its pages emptied: CRIU's restored
// task spins, logging each turn, and the shim kills CRIU once its log
// passes its bound), leaves a stopped
// sandbox, as if its processes had been killed: the Wait on its task
// returns, the error says why, and the task is deleted as any stopped
// one, leaving nothing behind.
func TestMemoryRollbackSandboxFails(t *testing.T) {
	t.Run("lost", func(t *testing.T) {
		testRollbackDamaged(t, os.Remove, "")
	})
	t.Run("hung", func(t *testing.T) {
		testRollbackDamaged(t, func(p string) error { return os.Truncate(p, 0) }, "CRIU was killed")
	})
}

func testRollbackDamaged(t *testing.T, damage func(string) error, why string) {
	ctx, env, sc := replSandbox(t)
	if _, err := sc.Checkpoint(ctx, "", "s1", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "checkpoints", "*", "*", "memory", "pages-*.img"))
	if len(pages) == 0 {
		t.Fatal("no memory pages in the checkpoint (the test looks in the wrong place)")
	}
	for _, p := range pages {
		if err := damage(p); err != nil {
			t.Fatal(err)
		}
	}
	st := watchSandboxTask(t, ctx, env)
	start := time.Now()
	err := sc.Rollback(ctx, "", "s1")
	t.Logf("rollback failed after %s: %v", time.Since(start), err)
	if err == nil || !strings.Contains(err.Error(), "the sandbox has stopped") || !strings.Contains(err.Error(), why) {
		t.Fatalf("rollback to a damaged image: %v; want an error saying the sandbox stopped (and %q)", err, why)
	}
	assertNoCriu(t, env)
	select {
	case e := <-st.exit:
		if e.ExitCode() != 137 {
			t.Fatalf("exit after a failed rollback: %d, want 137", e.ExitCode())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the Wait on the task did not return after a failed rollback")
	}
	s, err := st.task.Status(ctx)
	if err != nil || s.Status != containerd.Stopped {
		t.Fatalf("task after a failed rollback: %+v %v, want stopped", s, err)
	}
	if _, err := st.task.Delete(ctx); err != nil {
		t.Fatalf("delete of the stopped sandbox's task: %v", err)
	}
	if out, err := env.Ctr(ctx, "tasks", "ls"); err != nil || strings.Contains(out, "sb ") {
		t.Fatalf("tasks after the delete: %q %v", out, err)
	}
}

// sandboxBundle is the REPL sandbox's bundle.
func sandboxBundle(env *daemons.Env) string {
	return filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb")
}

// TestMemoryRollbackSandboxShimKill kills (SIGKILL) the shim at a random
// moment of a rollback of the sandbox with its processes (the kill, the
// old task's delete, the rootfs's rollback, the restore): containerd's
// cleanup takes the sandbox down, and no process (old or restored), CRIU,
// mount (the kept network namespace, the restore's tmpfs copies) or
// runtime state of it is left.
func TestMemoryRollbackSandboxShimKill(t *testing.T) {
	for round := 0; round < 5; round++ {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			ctx, env, sc := replSandbox(t)
			replIn(t, ctx, env, sc, branch.RootID, 0, `mem=saved`)
			if _, err := sc.Checkpoint(ctx, "", "s1", client.CheckpointWithMemory()); err != nil {
				t.Fatal(err)
			}
			death := watchShimDeath(t, ctx, env)
			procs := containerHostProcs(env.Namespace, "sb", death.initPid)
			go func() { _ = sc.Rollback(ctx, "", "s1") }()
			time.Sleep(time.Duration(round*30+rand.Intn(30)) * time.Millisecond)
			death.kill(t)
			waitUntil(t, "the sandbox's old processes to end", 10*time.Second, func() bool { return len(survivors(procs)) == 0 })
			waitUntil(t, "no process left in the sandbox's cgroup", 10*time.Second, func() bool {
				return len(containerHostProcs(env.Namespace, "sb", 0)) == 0
			})
			assertNoCriu(t, env)
			bundle := sandboxBundle(env)
			waitUntil(t, "no mount left in the sandbox's bundle or runtime state", 10*time.Second, func() bool {
				return len(mountsUnder(bundle)) == 0 && len(mountsUnder(filepath.Join(runtimeRoot, env.Namespace))) == 0
			})
		})
	}
}

// TestMemoryRollbackNerdctlStyle rolls back, with its processes, a
// container made as nerdctl makes it: its OCI hooks (nerdctl's network
// setup and teardown) run once at its creation and once at its real end,
// not for the replacement, and its binary logger gets the restored
// processes' output.
func TestMemoryRollbackNerdctlStyle(t *testing.T) {
	ctx, env := startEnv(t)
	id := "nerdctl-mem"
	ns := newNerdctlStyle(t, ctx, env, id, `n=0; echo ready; while :; do if [ -e /go ]; then rm /go; n=$((n+1)); echo "n=$n"; fi; sleep 0.02; done`)
	ctx = ns.ctx
	task, err := ns.container.NewTask(ctx, cio.LogURI(ns.logURI))
	if err != nil {
		t.Fatal(err)
	}
	exitCh, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var created specs.State
	readHook(t, ns.hookDir, "createRuntime", &created)
	stdout := filepath.Join(ns.dataStore, env.Namespace, id, "stdout")
	logged := func(want string) {
		t.Helper()
		waitUntil(t, "the logger to get "+strings.TrimSpace(want), 10*time.Second, func() bool {
			b, _ := os.ReadFile(stdout)
			return string(b) == want
		})
	}
	step := func() {
		t.Helper()
		if out, err := execIn(ctx, env, id, "touch", "/go"); err != nil {
			t.Fatalf("exec: %v %s", err, out)
		}
	}
	logged("ready\n")
	step()
	logged("ready\nn=1\n")
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.Checkpoint(ctx, "", "one", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	step()
	logged("ready\nn=1\nn=2\n")
	if err := sc.Rollback(ctx, "", "one"); err != nil {
		t.Fatalf("rollback of a nerdctl-style container with memory: %v", err)
	}
	step()
	logged("ready\nn=1\nn=2\nn=2\n")
	var again specs.State
	readHook(t, ns.hookDir, "createRuntime", &again)
	if again.Pid != created.Pid {
		t.Errorf("the createRuntime hook ran again for the replacement (pid %d, first %d)", again.Pid, created.Pid)
	}
	if _, err := os.Stat(filepath.Join(ns.hookDir, "postStop.json")); !os.IsNotExist(err) {
		t.Errorf("the postStop hook ran for the replacement: %v", err)
	}
	select {
	case e := <-exitCh:
		t.Fatalf("the Wait on the task returned (%d) for the replacement", e.ExitCode())
	default:
	}
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exitCh:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit within 10s of SIGKILL")
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	var stopped specs.State
	readHook(t, ns.hookDir, "postStop", &stopped)
	if stopped.ID != id {
		t.Errorf("postStop hook state id %q", stopped.ID)
	}
}

// TestMemoryRollbackSandboxSnapshotterKill kills (SIGKILL) the snapshotter
// at a random moment of a rollback of the sandbox with its processes, and
// starts it again: the sandbox runs on whatever happened. Either the
// rollback was refused before anything changed (the snapshotter could not
// be asked) and the sandbox runs its own state, or it was carried through
// (the shim waits for the snapshotter once the old processes are gone) and
// runs the checkpoint's; its task is never seen to end.
func TestMemoryRollbackSandboxSnapshotterKill(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=saved`)
	if _, err := sc.Checkpoint(ctx, "", "s1", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	st := watchSandboxTask(t, ctx, env)
	next := 1 // the REPL's next command
	for round := 0; round < 4; round++ {
		replIn(t, ctx, env, sc, branch.RootID, next, `mem=changed`)
		next++
		done := make(chan error, 1)
		go func() { done <- sc.Rollback(ctx, "", "s1") }()
		time.Sleep(time.Duration(round*20+rand.Intn(20)) * time.Millisecond)
		if err := env.StopSnapshotter(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if err := env.StartSnapshotter(ctx); err != nil {
			t.Fatal(err)
		}
		err := <-done
		t.Logf("round %d: rollback: %v", round, err)
		st.assertRunsOn(t, ctx, fmt.Sprintf("round %d", round))
		want := "changed\n"
		if err != nil && !errdefs.IsUnavailable(err) {
			t.Fatalf("round %d: a rollback refused for want of the snapshotter: %v; want unavailable, to retry", round, err)
		}
		if err == nil {
			want, next = "saved\n", 1 // the checkpoint's REPL, at its command 1
		}
		if got := replIn(t, ctx, env, sc, branch.RootID, next, `echo $mem`); got != want {
			t.Fatalf("round %d: after the rollback (%v) the sandbox's REPL has mem=%q, want %q", round, err, got, want)
		}
		next++
	}
}
