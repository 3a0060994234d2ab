//go:build linux

package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// sandboxCounter is waitCounter of a sandbox.
func sandboxCounter(t *testing.T, ctx context.Context, env *daemons.Env, id string) (string, int) {
	t.Helper()
	return waitCounter(t, func() (string, error) { return execIn(ctx, env, id, "cat", "/count") })
}

// TestTaskCheckpointRestore checkpoints a sandbox with containerd's own
// checkpoint of a task and its rw layer (`ctr containers checkpoint --task
// --rw`, what nerdctl checkpoint create does: containerd pauses the task,
// the runtime dumps it), while it has a live branch, then restores it
// into a new container of the same id (`ctr containers restore --rw
// --live`). The sandbox's network namespace is its own here (ctr makes
// one): the image holds it and the restore makes it again, as runc's
// does. Before, the checkpoint waited 10s on the paused processes and
// failed, and a restore failed with "Unable to find an external netns".
func TestTaskCheckpointRestore(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	for _, seal := range []string{"ro", "freeze"} {
		t.Run("seal="+seal, func(t *testing.T) { taskCheckpointRestore(t, ctx, env, seal) })
	}
}

// taskCheckpointRestore is TestTaskCheckpointRestore with the sandbox's
// branch forked with seal: with "freeze" its processes are in a leaf
// cgroup the seal froze, which stays frozen when CRIU thaws the paused
// sandbox's cgroup (before, the dump waited 10s on them and failed).
func taskCheckpointRestore(t *testing.T, ctx context.Context, env *daemons.Env, seal string) {
	sc := runSandbox(t, ctx, env, ociimage.ImageRef, "sh", "-c", counterScript)
	born, at := sandboxCounter(t, ctx, env, "sb")
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo written > /rw-file"); err != nil {
		t.Fatal(err)
	}
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1, Seal: seal})

	if seal == "freeze" {
		// Through containerd's task service without its client's pause:
		// the sealed processes cannot be thawed for CRIU, so refused.
		cc, _ := sandboxTask(t, ctx, env, "sb")
		_, err := cc.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{ContainerID: "sb"})
		if err = errgrpc.ToNative(err); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pause it first") {
			t.Fatalf("a checkpoint of the sealed sandbox not paused: %v; want failed precondition, pause it first", err)
		}
	}
	const ref = "checkpoint/sb:1"
	if _, err := env.Ctr(ctx, "containers", "checkpoint", "--task", "--rw", "sb", ref); err != nil {
		t.Fatal(err)
	}
	defer env.Ctr(context.Background(), "images", "rm", ref)
	if st := taskStatus(t, ctx, env, "sb"); st != "RUNNING" {
		t.Fatalf("sandbox %s after its checkpoint, want RUNNING", st)
	}
	if out := mustRun(t, ctx, sc, kids[0].ID, "cat", "/rw-file"); out != "written\n" {
		t.Fatalf("its branch after the checkpoint reads %q", out)
	}
	if seal == "freeze" {
		// Still sealed: the sandbox's processes are frozen in the seal's
		// leaf, the sandbox resumed.
		frozen := " FROZEN"
		if cgroupV2() {
			frozen = " frozen 1"
		}
		if st := freezerState(sandboxInitPid(t, ctx, sc)); !strings.HasSuffix(st, "/.sealed"+frozen) {
			t.Fatalf("the sandbox's init after the checkpoint, sealed frozen by its branch's fork: %q", st)
		}
	}

	removeContainer(t, env, "sb")
	if _, err := env.Ctr(ctx, "containers", "restore", "--rw", "--live", "sb", ref); err != nil {
		t.Fatal(err)
	}
	// Its /count is the checkpoint's until the restored shell writes.
	waitUntil(t, "the restored sandbox's shell to count on from its checkpoint", 10*time.Second, func() bool {
		b, n := sandboxCounter(t, ctx, env, "sb")
		return b == born && n > at
	})
	if out, err := execIn(ctx, env, "sb", "cat", "/rw-file"); err != nil || out != "written\n" {
		t.Fatalf("restored sandbox's /rw-file: %q %v", out, err)
	}
	rc := sandboxClient(t, ctx, env, "sb")
	kids = fork(t, ctx, rc, client.ForkOptions{Count: 1})
	if out := mustRun(t, ctx, rc, kids[0].ID, "cat", "/count"); !strings.HasPrefix(out, born+" ") {
		t.Fatalf("a branch of the restored sandbox reads /count %q, want the shell's number %s", out, born)
	}
}
