//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// adversarial is a container init that makes itself hard to kill: it and
// its helpers ignore SIGTERM, SIGINT and SIGHUP; a double-forked setsid
// daemon; a process in its own nested PID namespace; and a fork bomb that
// the pids limit holds at the limit.
const adversarial = `trap '' TERM INT HUP
setsid sh -c 'trap "" TERM INT HUP; sleep 1000 & sleep 1000 &'
(trap '' TERM INT HUP; while :; do sleep 1; done) &
unshare -p -f sh -c 'sleep 1000 & touch /nested; exec sleep 1000' &
while [ ! -e /nested ]; do sleep 0.05; done
(trap '' TERM INT HUP; while :; do sleep 1000 & done) 2>/dev/null &
while :; do sleep 1; done`

const adversarialPidsLimit = 48

// adversarialWithExec is adversarial whose fork bomb waits for /bomb, which
// an exec'd process makes: once the bomb holds the pids limit, an exec
// (whose runtime helpers count against the limit too) could not start.
var adversarialWithExec = strings.Replace(adversarial,
	"(trap '' TERM INT HUP; while :; do sleep 1000 & done)",
	"while [ ! -e /bomb ]; do sleep 0.05; done\n(trap '' TERM INT HUP; while :; do sleep 1000 & done)", 1)

// startAdversarial starts the adversarial container with the branch runtime
// and waits until, seen from the host, the fork bomb has filled the pids
// limit and the nested PID namespace exists. It returns the task and the
// container's processes at that point.
func startAdversarial(t *testing.T, ctx context.Context, env *daemons.Env, client *containerd.Client, id, snapshotter string) (containerd.Task, []hostProc) {
	t.Helper()
	img, err := client.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewContainer(ctx, id,
		containerd.WithSnapshotter(snapshotter),
		containerd.WithNewSnapshot(id, img),
		containerd.WithRuntime(branchRuntime, nil),
		containerd.WithNewSpec(oci.WithImageConfig(img),
			oci.WithProcessArgs("sh", "-c", adversarialWithExec),
			oci.WithPidsLimit(adversarialPidsLimit),
			oci.WithAddedCapabilities([]string{"CAP_SYS_ADMIN"})))
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// An exec'd process too; it lets the fork bomb go.
	spec, err := task.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pspec := *spec.Process
	pspec.Args = []string{"sh", "-c", "touch /bomb; exec sleep 1000"}
	if proc, err := task.Exec(ctx, "ex", &pspec, cio.NullIO); err != nil {
		t.Fatal(err)
	} else if err := proc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	initPid := int(task.Pid())
	initNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", initPid))
	var procs []hostProc
	nested := false
	defer func() {
		if t.Failed() {
			t.Logf("container processes seen from the host: %d (nested PID namespace: %v)", len(procs), nested)
		}
	}()
	waitUntil(t, "the fork bomb to fill the pids limit and the nested PID namespace", 20*time.Second, func() bool {
		procs = containerHostProcs(env.Namespace, id, initPid)
		nested = false
		for _, p := range procs {
			if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.pid)); ns != "" && ns != initNS {
				nested = true
			}
		}
		return nested && len(procs) >= adversarialPidsLimit-4
	})
	// The polite signals do nothing.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		if err := task.Kill(ctx, sig); err != nil {
			t.Fatalf("kill %v: %v", sig, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Running {
		t.Fatalf("init did not ignore SIGTERM/SIGINT/SIGHUP: %v %v", st, err)
	}
	return task, procs
}

// TestShimKillGuarantees kills adversarial containers, running and paused
// (on cgroup v1 a frozen task ignores SIGKILL until thawed), and checks from
// the host that after kill and delete no process, cgroup, mount or state of
// theirs is left.
func TestShimKillGuarantees(t *testing.T) {
	ctx, env, client := shimEnv(t)
	for _, tc := range []struct {
		name, snapshotter string
		pause             bool
	}{
		{"running", "branch", false},
		{"paused", "overlayfs", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "adv-" + tc.name
			task, procs := startAdversarial(t, ctx, env, client, id, tc.snapshotter)
			if tc.pause {
				if err := task.Pause(ctx); err != nil {
					t.Fatal(err)
				}
				if st, _ := task.Status(ctx); st.Status != containerd.Paused {
					t.Fatalf("status after pause: %v", st.Status)
				}
			}
			procs = append(procs, containerHostProcs(env.Namespace, id, int(task.Pid()))...)
			ch, err := task.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case ex := <-ch:
				if ex.ExitCode() != 137 {
					t.Errorf("exit code %d, want 137", ex.ExitCode())
				}
			case <-time.After(15 * time.Second):
				t.Fatal("task not reaped within 15s of SIGKILL")
			}
			if _, err := task.Delete(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := client.LoadContainer(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
				t.Fatal(err)
			}
			assertContainerGone(t, env, id, procs)
		})
	}
}

// TestShimDeath kills the shim with SIGKILL under adversarial containers,
// running and paused: containerd's cleanup path (the shim binary's delete
// subcommand) must kill every process and remove cgroups, mounts and state,
// with no help from the dead shim.
func TestShimDeath(t *testing.T) {
	ctx, env, client := shimEnv(t)
	for _, tc := range []struct {
		name, snapshotter string
		pause             bool
		// cut: options.json left empty, as by a shim killed while the
		// task service rewrote it (a rollback with processes creates the
		// task again); the cleanup takes the kept copy.
		cut bool
	}{
		{"running", "overlayfs", false, false},
		{"paused", "branch", true, false},
		{"options-cut", "branch", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "dead-" + tc.name
			before := map[int]bool{}
			for _, p := range env.ShimPids() {
				before[p] = true
			}
			task, procs := startAdversarial(t, ctx, env, client, id, tc.snapshotter)
			if tc.pause {
				if err := task.Pause(ctx); err != nil {
					t.Fatal(err)
				}
			}
			var shims []int
			for _, p := range env.ShimPids() {
				if !before[p] {
					shims = append(shims, p)
				}
			}
			if len(shims) != 1 {
				t.Fatalf("want exactly one new shim for %s, found %v", id, shims)
			}
			// A shim killed by SIGKILL cannot remove its sockets; the
			// cleanup path (the shim binary's delete) must.
			sockets := existing(env.ShimSockets(shims[0]))
			if len(sockets) == 0 {
				t.Fatalf("no socket of shim %d found", shims[0])
			}
			t.Cleanup(func() { removeFiles(sockets) })
			if tc.cut {
				opts := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, id, "options.json")
				if err := os.Truncate(opts, 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := syscall.Kill(shims[0], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// containerd notices the dead shim and runs the shim binary's
			// delete; wait for that to finish too (it carries the address).
			waitUntil(t, "containerd to clean up after the dead shim", 20*time.Second, func() bool {
				for _, p := range env.ShimPids() {
					if !before[p] {
						return false
					}
				}
				return len(survivors(procs)) == 0 && len(containerCgroupDirs(env.Namespace, id)) == 0
			})
			waitUntil(t, "the dead shim's sockets to be removed", 10*time.Second, func() bool { return len(existing(sockets)) == 0 })
			c, err := client.LoadContainer(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if task, err := c.Task(ctx, nil); err == nil {
				_, _ = task.Delete(ctx)
			}
			if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
				t.Fatal(err)
			}
			assertContainerGone(t, env, id, procs)
		})
	}
	// Created but never started: init waits on the exec fifo.
	t.Run("created", func(t *testing.T) {
		id := "dead-created"
		before := map[int]bool{}
		for _, p := range env.ShimPids() {
			before[p] = true
		}
		img, err := client.GetImage(ctx, ociimage.ImageRef)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.NewContainer(ctx, id, containerd.WithSnapshotter("branch"), containerd.WithNewSnapshot(id, img),
			containerd.WithRuntime(branchRuntime, nil), containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sleep", "1000")))
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		procs := containerHostProcs(env.Namespace, id, int(task.Pid()))
		if len(procs) == 0 {
			t.Fatal("no process of the created container seen from the host")
		}
		var shims []int
		for _, p := range env.ShimPids() {
			if !before[p] {
				shims = append(shims, p)
			}
		}
		if len(shims) != 1 {
			t.Fatalf("want exactly one new shim for %s, found %v", id, shims)
		}
		sockets := existing(env.ShimSockets(shims[0]))
		if len(sockets) == 0 {
			t.Fatalf("no socket of shim %d found", shims[0])
		}
		t.Cleanup(func() { removeFiles(sockets) })
		if err := syscall.Kill(shims[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "containerd to clean up after the dead shim", 20*time.Second, func() bool {
			for _, p := range env.ShimPids() {
				if !before[p] {
					return false
				}
			}
			return len(survivors(procs)) == 0 && len(containerCgroupDirs(env.Namespace, id)) == 0
		})
		waitUntil(t, "the dead shim's sockets to be removed", 10*time.Second, func() bool { return len(existing(sockets)) == 0 })
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
			t.Fatal(err)
		}
		assertContainerGone(t, env, id, procs)
	})
}

// TestShimSharedPIDNamespace runs a container that joins another's PID
// namespace, as Kubernetes pods do: its own kill must take down every one
// of its processes (found through its cgroup, since its init is not PID 1
// of the namespace) and leave the other container running.
func TestShimSharedPIDNamespace(t *testing.T) {
	ctx, env, client := shimEnv(t)
	img, err := client.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	start := func(id string, opts ...oci.SpecOpts) containerd.Task {
		t.Helper()
		c, err := client.NewContainer(ctx, id, containerd.WithSnapshotter("branch"), containerd.WithNewSnapshot(id, img),
			containerd.WithRuntime(branchRuntime, nil), containerd.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img)}, opts...)...))
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return task
	}
	owner := start("pidns-owner", oci.WithProcessArgs("sleep", "1000"))
	ownerNS := fmt.Sprintf("/proc/%d/ns/pid", owner.Pid())
	joiner := start("pidns-joiner", oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: ownerNS}),
		oci.WithProcessArgs("sh", "-c", `trap '' TERM INT HUP; setsid sh -c 'sleep 1000 & sleep 1000 &'; (trap '' TERM; sleep 1000) & while :; do sleep 1; done`))
	var procs []hostProc
	waitUntil(t, "the joiner's daemons", 10*time.Second, func() bool {
		procs = containerHostProcs(env.Namespace, "pidns-joiner", 0)
		return len(procs) >= 5
	})
	theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", joiner.Pid()))
	if mine, _ := os.Readlink(ownerNS); theirs != mine {
		t.Fatalf("joiner is in PID namespace %s, not the owner's %s", theirs, mine)
	}
	ch, err := joiner.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := joiner.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("joiner not reaped")
	}
	if _, err := joiner.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if left := survivors(procs); len(left) != 0 {
		t.Fatalf("processes of the joiner survived its kill and delete: %v", left)
	}
	if st, err := owner.Status(ctx); err != nil || st.Status != containerd.Running {
		t.Fatalf("the owner did not survive the joiner's kill: %v %v", st, err)
	}
	jc, err := client.LoadContainer(ctx, "pidns-joiner")
	if err != nil {
		t.Fatal(err)
	}
	if err := jc.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	assertContainerGone(t, env, "pidns-joiner", procs)
	ownerProcs := containerHostProcs(env.Namespace, "pidns-owner", int(owner.Pid()))
	if _, err := owner.Delete(ctx, containerd.WithProcessKill); err != nil {
		t.Fatal(err)
	}
	oc, err := client.LoadContainer(ctx, "pidns-owner")
	if err != nil {
		t.Fatal(err)
	}
	if err := oc.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	assertContainerGone(t, env, "pidns-owner", ownerProcs)
}

// existing returns those of paths that exist.
func existing(paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// removeFiles removes the given files, ignoring those already gone.
func removeFiles(paths []string) {
	for _, p := range paths {
		_ = os.Remove(p)
	}
}
