//go:build linux

package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fstest"
)

// TestMemoryForkImageRoom: a memory image is written into the sandbox's
// bundle, in containerd's state directory, which is a tmpfs sized by the
// node's memory on most nodes. A sandbox holding more memory than is
// free there is refused before its processes are stopped, naming the
// memory and the space (resource exhausted), for a memory fork and a
// checkpoint with memory, with nothing left behind; the same sandbox
// without the big process forks with memory in the same space. Before,
// CRIU ran out of space midway, its processes stopped, with an error of
// no kind.
func TestMemoryForkImageRoom(t *testing.T) {
	requireRoot(t)
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	fstest.Tmpfs(t, mnt, "size=96m,mode=0711")
	// A name of its own: the env's namespace (and the runtime's state
	// under it, host-wide) is named after it.
	dir, err := os.MkdirTemp(mnt, "env-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	ctx, env, _ := shimEnvWith(t, daemons.Config{Dir: dir})
	// dd holds its 120 MB buffer, written, while it waits on the pipe.
	sc := runSandbox(t, ctx, env, "docker.io/branchbox/busybox:test", "sh", "-c", "dd if=/dev/zero bs=120M count=1 2>/dev/null | sleep 100000 & exec sleep 100000")
	waitDDHolds(t, ctx, env, 120)
	_, err = sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	t.Logf("refused: %v", err)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "MiB of memory") || !strings.Contains(err.Error(), "containerd's state directory") || strings.Contains(err.Error(), env.Dir) {
		t.Fatalf("memory fork of a sandbox bigger than the space for its image: %v; want resource exhausted naming the memory and the space, and no host path", err)
	}
	if _, err := sc.Checkpoint(ctx, "", "big", client.CheckpointWithMemory()); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "would not fit") {
		t.Fatalf("checkpoint with memory of the same: %v", err)
	}
	if kids, err := sc.Tree(ctx); err != nil || len(kids) != 1 {
		t.Fatalf("branches after the refusals: %v %v", kids, err)
	}
	assertNoMemoryImages(t, env)
	// The small rest of it forks with memory in the same space.
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "kill $(pidof dd)"); err != nil {
		t.Fatalf("kill dd: %v %s", err, out)
	}
	waitUntil(t, "a memory fork once dd is gone", 10*time.Second, func() bool {
		_, err = sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
		return err == nil
	})
	assertNoMemoryImages(t, env)
}

// TestMemoryForkMemoryLimit: a memory fork's copies are charged to the
// sandbox's memory limit (its branches' cgroups are nested in its). A
// sandbox of 100 MiB whose dd holds 40 MiB: a fork of 3 copies is refused
// before anything changes, naming the figures (before, it succeeded, and
// the kernel then killed a restored dd for want of memory: a branch short
// of the process it was forked for, its status "running"); a fork of 1
// fits, its dd there. A fork of 3 from a checkpoint with memory of it is
// refused alike.
func TestMemoryForkMemoryLimit(t *testing.T) {
	ctx, env, _ := shimEnvWith(t, daemons.Config{})
	if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "--memory-limit", strconv.Itoa(100<<20), "docker.io/branchbox/busybox:test", "sb", "sh", "-c", "dd if=/dev/zero bs=40M count=1 2>/dev/null | sleep 100000 & exec sleep 100000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb") })
	sc := sandboxClient(t, ctx, env, "sb")
	waitDDHolds(t, ctx, env, 40)
	_, err := sc.Fork(ctx, client.ForkOptions{Count: 3, WithMemory: true})
	t.Logf("refused: %v", err)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "3 copies of its processes' memory") || !strings.Contains(err.Error(), "the memory limit of the sandbox's cgroup leaves") || !strings.Contains(err.Error(), "of its 100MiB") {
		t.Fatalf("memory fork of 3 copies of 40 MiB under 100 MiB: %v; want resource exhausted naming the limit", err)
	}
	nodes, err := sc.Tree(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].OOMKilled {
		t.Fatalf("after the refusal: %+v %v, want the sandbox alone and no OOM kill", nodes, err)
	}
	// From a checkpoint with memory, the image's copies alike.
	if _, err := sc.Checkpoint(ctx, "", "c", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Fork(ctx, client.ForkOptions{Count: 3, WithMemory: true, From: "c"}); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "from checkpoint \"c\": 3 copies of its processes' memory") {
		t.Fatalf("memory fork of 3 copies from a checkpoint of 40 MiB under 100 MiB: %v", err)
	}
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork of 1 copy of 40 MiB under 100 MiB: %v", err)
	}
	out, code := run(t, ctx, sc, kids[0].ID, "pidof", "dd")
	if code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("the branch's dd: %q %d", out, code)
	}
}

// waitDDHolds waits until sandbox sb's dd holds mib MiB resident: its
// buffer, written, while it waits on its pipe.
func waitDDHolds(t *testing.T, ctx context.Context, env *daemons.Env, mib int) {
	t.Helper()
	waitUntil(t, "dd's buffer", 10*time.Second, func() bool {
		out, err := execIn(ctx, env, "sb", "sh", "-c", "grep VmRSS /proc/$(pidof dd)/status")
		f := strings.Fields(out)
		if err != nil || len(f) != 3 {
			return false
		}
		kb, err := strconv.Atoi(f[1])
		return err == nil && kb >= mib<<10
	})
}
