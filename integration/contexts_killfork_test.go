//go:build linux

package integration

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestContextsKillDuringFork: a sandbox killed (ctr task kill, as nerdctl
// kill does) or deleted with force while a fork of 32 branches runs. The
// fork either completes or fails with failed precondition, saying that
// the sandbox's init exited and the branches were undone (before: the
// start that failed first, "set up: join namespace /proc/PID/ns/net: No
// such file or directory", or a cgroup write with its host path, kind
// unknown); and once the container is deleted nothing of it is left:
// no branch layer, mount, cgroup or shim.
func TestContextsKillDuringFork(t *testing.T) {
	testKillDuringFork(t, client.ForkOptions{Count: 32, Args: []string{"sleep", "1000"}}, 3,
		"the sandbox's init exited during the fork; its branches were undone")
}

// TestMemoryForkKillDuringFork: the same with a memory fork of 2, the kill
// falling in the dump or in the restores. Before, a restore cut short
// left a branch whose init never started, and the fork's undo waited 10
// s for that init's exit, holding the sandbox (and the kill's own
// clean-up) meanwhile; a dump cut short said "container cannot be
// checkpointed in stopped state", or CRIU's first error line, about an
// RLIMIT.
func TestMemoryForkKillDuringFork(t *testing.T) {
	testKillDuringFork(t, client.ForkOptions{Count: 2, WithMemory: true}, 6,
		"the sandbox's init exited during the fork; its branches were undone",
		"the sandbox's init exited during the dump of its processes")
}

// testKillDuringFork forks with opts in 8 sandboxes, killing the k-th
// k*step ms (and a little) into its fork.
func testKillDuringFork(t *testing.T, opts client.ForkOptions, step int, words ...string) {
	ctx, env, _ := shimEnvWith(t, daemons.Config{})
	refused := 0
	for round := range 8 {
		id := fmt.Sprintf("k%d", round)
		if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "docker.io/branchbox/busybox:test", id, "sleep", "100000"); err != nil {
			t.Fatal(err)
		}
		sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := sc.Fork(ctx, opts)
			done <- err
		}()
		time.Sleep(time.Duration(round*step+rand.Intn(step)) * time.Millisecond)
		if round%2 == 0 {
			_, _ = env.Ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
		} else {
			_, _ = env.Ctr(ctx, "tasks", "delete", "-f", id)
		}
		err = <-done
		sc.Close()
		if err != nil {
			worded := false
			for _, w := range words {
				worded = worded || strings.Contains(err.Error(), w)
			}
			if !errdefs.IsFailedPrecondition(err) || !worded {
				t.Fatalf("round %d: fork of a sandbox killed meanwhile: %v", round, err)
			}
			refused++
		}
		removeContainer(t, env, id)
		for _, d := range containerCgroupDirs(env.Namespace, id) {
			t.Errorf("round %d: cgroup %s left", round, d)
		}
	}
	t.Logf("%d of 8 forks refused, the sandbox gone during them", refused)
	if refused == 0 {
		t.Fatal("no fork was refused: the kill came after every fork, and nothing was checked")
	}
	// The snapshotter removes a deleted root's layers in the background.
	var left []os.DirEntry
	waitUntil(t, "no branch layer left", 10*time.Second, func() bool {
		left, _ = os.ReadDir(filepath.Join(env.SnapshotterRoot, "branches"))
		return len(left) == 0
	})
	if m := mountsUnder(env.Dir); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	waitUntil(t, "the shims to exit", 10*time.Second, func() bool { return len(env.ShimPids()) == 0 })
	if strings.Contains(env.Log("containerd"), `msg="wait for branch init"`) {
		t.Error("a branch's end waited for its init's exit (10 s for an init that never started)")
	}
	assertNoCriu(t, env)
}

// TestMemoryRollbackKillDuringRollback: a sandbox killed while one of its
// memory branches is rolled back to a checkpoint with memory. The
// rollback completes or fails with failed precondition saying that the
// sandbox's init exited (before: the runtime's "Requested network
// namespace /proc/PID/ns/net does not exist", of no kind), and nothing of
// the sandbox is left once it is deleted.
func TestMemoryRollbackKillDuringRollback(t *testing.T) {
	ctx, env, _ := shimEnvWith(t, daemons.Config{})
	refused := 0
	for round := range 10 {
		id := fmt.Sprintf("m%d", round)
		// 20 MB written first: the rollback's kill, diff and restore
		// take long enough for the kill to fall among them.
		if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "docker.io/branchbox/busybox:test", id, "sh", "-c", "dd if=/dev/zero of=/f bs=1M count=20 2>/dev/null; echo > /ready; exec sleep 100000"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { _, err := execIn(ctx, env, id, "test", "-e", "/ready"); return err == nil })
		sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
		if err != nil {
			t.Fatal(err)
		}
		kids, err := sc.Fork(ctx, client.ForkOptions{Count: 2, WithMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sc.Checkpoint(ctx, kids[0].ID, "m0", client.CheckpointWithMemory()); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- sc.Rollback(ctx, kids[0].ID, "m0") }()
		time.Sleep(time.Duration(round*5) * time.Millisecond)
		_, _ = env.Ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
		err = <-done
		sc.Close()
		if err != nil {
			if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "the sandbox's init exited during the rollback; the branch ends with it") {
				t.Fatalf("round %d: rollback of a memory branch of a sandbox killed meanwhile: %v", round, err)
			}
			refused++
		}
		removeContainer(t, env, id)
	}
	t.Logf("%d of 10 rollbacks refused, the sandbox gone during them", refused)
	if refused == 0 {
		t.Fatal("no rollback was refused: the kill came after every one, and nothing was checked")
	}
	waitUntil(t, "no branch layer left", 10*time.Second, func() bool {
		left, _ := os.ReadDir(filepath.Join(env.SnapshotterRoot, "branches"))
		return len(left) == 0
	})
	if m := mountsUnder(env.Dir); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	assertNoCriu(t, env)
}
