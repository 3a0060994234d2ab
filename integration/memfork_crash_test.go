//go:build linux

package integration

import (
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/events"
)

// TestMemoryForkCrash kills (SIGKILL) the snapshotter, and in a second
// variant the shim, at a random moment of a memory fork of two branches
// (the seal, the dump, the restores). A killed snapshotter is restarted:
// the shim then runs exactly the branches the snapshotter holds live,
// each can be aborted, the sandbox's processes run on with their state,
// and no memory image is left. A killed shim takes its sandbox down
// (containerd's cleanup): no process, branch cgroup, mount, CRIU process
// or memory image of it is left.
func TestMemoryForkCrash(t *testing.T) {
	t.Run("snapshotter", func(t *testing.T) {
		ctx, env, sc := replSandbox(t)
		replIn(t, ctx, env, sc, branch.RootID, 0, `mem=kept`)
		for round := 0; round < 3; round++ {
			done := make(chan error, 1)
			go func() {
				_, err := sc.ForkResult(ctx, client.ForkOptions{Count: 2, WithMemory: true})
				done <- err
			}()
			time.Sleep(time.Duration(rand.Intn(250)) * time.Millisecond)
			if err := env.StopSnapshotter(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			err := <-done
			t.Logf("round %d: fork: %v", round, err)
			if err := env.StartSnapshotter(ctx); err != nil {
				t.Fatal(err)
			}
			// Both read again each time: the shim's reconciliation may
			// abort the branches a fork cut short made in the
			// snapshotter after the first reading (the fork's reply was
			// lost), which then hold it live no more.
			var got, want []string
			for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				want = liveInSnapshotter(t, ctx, env, "sb")
				if got = runningInShim(t, ctx, sc); slices.Equal(got, want) {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("round %d: after 20s the shim runs branches %v; the snapshotter holds %v live", round, got, want)
				}
			}
			for _, id := range want {
				if _, err := sc.Abort(ctx, id); err != nil {
					t.Fatalf("round %d: abort %s: %v", round, id, err)
				}
			}
			if dirs, pids := branchCgroupsOf(env.Namespace, "sb"); len(pids) > 0 {
				t.Fatalf("round %d: processes left in branch cgroups %v: %v", round, dirs, pids)
			}
			assertNoMemoryImages(t, env)
			if got := replIn(t, ctx, env, sc, branch.RootID, round+1, `echo $mem`); got != "kept\n" {
				t.Fatalf("round %d: the sandbox's REPL after the crash: %q", round, got)
			}
		}
	})
	t.Run("shim", func(t *testing.T) {
		ctx, env, sc := replSandbox(t)
		replIn(t, ctx, env, sc, branch.RootID, 0, `mem=kept`)
		death := watchShimDeath(t, ctx, env)
		bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb")
		go func() { _, _ = sc.ForkResult(ctx, client.ForkOptions{Count: 2, WithMemory: true}) }()
		// Past the seal, into the dump or the restores.
		time.Sleep(time.Duration(50+rand.Intn(200)) * time.Millisecond)
		procs := containerHostProcs(env.Namespace, "sb", death.initPid)
		death.kill(t)
		waitUntil(t, "the sandbox's processes to end", 10*time.Second, func() bool { return len(survivors(procs)) == 0 })
		if dirs, pids := branchCgroupsOf(env.Namespace, "sb"); len(dirs) > 0 || len(pids) > 0 {
			t.Fatalf("branch cgroups %v (processes %v) left", dirs, pids)
		}
		assertNoCriu(t, env)
		// containerd removes the bundle just after it reports the exit.
		waitUntil(t, "no memory image and no mount left in the sandbox's bundle", 10*time.Second, func() bool {
			left, _ := filepath.Glob(filepath.Join(bundle, ".memory-fork-*"))
			return len(left) == 0 && len(mountsUnder(bundle)) == 0
		})
	})
}

// assertNoCriu checks that no CRIU of this checkout's bin/ runs.
func assertNoCriu(t *testing.T, env *daemons.Env) {
	t.Helper()
	criu := filepath.Join(env.BinDir, "criu")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == criu {
			t.Errorf("CRIU left running: pid %s", e.Name())
		}
	}
}

// mountsUnder lists the mount points below dir.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// shimDeath watches the REPL sandbox's task for the death of its one shim.
type shimDeath struct {
	shim, initPid int
	exited        <-chan containerd.ExitStatus
	deleted       <-chan *events.Envelope
	errs          <-chan error
}

// watchShimDeath starts a Wait on the sandbox's task and a watch of
// containerd's task deletions (published once its cleanup of a dead shim,
// the shim binary's delete, is done).
func watchShimDeath(t *testing.T, ctx context.Context, env *daemons.Env) *shimDeath {
	t.Helper()
	cc, task := sandboxTask(t, ctx, env, "sb")
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	evctx, stopEvents := context.WithCancel(ctx)
	t.Cleanup(stopEvents)
	deleted, errs := cc.EventService().Subscribe(evctx, `topic=="/tasks/delete"`)
	shims := env.ShimPids()
	if len(shims) != 1 {
		t.Fatalf("shims: %v", shims)
	}
	return &shimDeath{shim: shims[0], initPid: int(task.Pid()), exited: exited, deleted: deleted, errs: errs}
}

// kill SIGKILLs the shim, then waits for the task to exit (its Wait ends
// with the shim's connection, before containerd's cleanup of the shim)
// and for containerd to report it deleted: the cleanup is done.
func (d *shimDeath) kill(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(d.shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox's task did not exit within 30s of its shim's death")
	}
	select {
	case <-d.deleted:
	case err := <-d.errs:
		t.Fatalf("containerd's events: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("containerd did not report the dead shim's task deleted within 30s")
	}
}
