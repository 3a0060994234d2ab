package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/client"
)

// TestUpdateWithBranches: containerd's update of a sandbox's resources
// (nerdctl update, the CRI's UpdateContainerResources: a pod's in-place
// resize, the kubelet CPU manager's cpusets) while it has live branches,
// one nested and one with a CPU limit of its own. On cgroup v1 the kernel
// refuses a cpuset that leaves out CPUs a child cgroup has and a quota
// below a child's: before, the update failed ("device or resource busy",
// "invalid argument"), and so did a memory fork after an update that
// narrowed the sandbox (its branch's spec had the sandbox's old cpuset),
// and a fork whose --cpus was above the sandbox's. Now the branches
// follow the sandbox's cpuset both ways, are bounded by its new quota,
// and forks after the update work, a memory fork's included.
func TestUpdateWithBranches(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t, "--cpuset-cpus", "0-1", "--cpu-quota", "150000", "--cpu-period", "100000")
	_, task := sandboxTask(t, ctx, env, "sb")
	limited := fork(t, ctx, sc, client.ForkOptions{Count: 1, CPUs: 1})[0]
	plain := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	nested := fork(t, ctx, sc, client.ForkOptions{Parent: plain.ID, Count: 1})[0]
	update := func(cpus string, quota int64) {
		t.Helper()
		period := uint64(100000)
		err := task.Update(ctx, containerd.WithResources(&specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: cpus, Quota: &quota, Period: &period}}))
		if err != nil {
			t.Fatalf("update of the sandbox with branches to cpuset %s, quota %d: %v", cpus, quota, err)
		}
	}
	allowed := func(what string, pid int, want string) {
		t.Helper()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "Cpus_allowed_list:" {
				if f[1] != want {
					t.Errorf("%s (pid %d) may run on CPUs %s; want %s", what, pid, f[1], want)
				}
				return
			}
		}
		t.Fatalf("%s: no Cpus_allowed_list", what)
	}

	update("0", 50000)
	for _, b := range []client.BranchInfo{limited, plain, nested} {
		allowed("branch "+b.ID+" after the update to CPU 0", b.InitPid, "0")
	}
	if !cgroupV2() {
		// Its limit of 1 CPU is above the sandbox's new half: the
		// kernel keeps none such, and the branch is bounded by the
		// sandbox's.
		if q := strings.TrimSpace(string(readFile(t, cgroupFile("cpu", limited.Cgroup, "cpu.cfs_quota_us")))); q != "-1" {
			t.Errorf("quota of the branch limited to 1 CPU under a sandbox of half of one: %s; want none (-1)", q)
		}
	}
	// Forks after the update: through the branch init with a CPU
	// limit above the sandbox's, and a memory fork (the runtime's path).
	above := fork(t, ctx, sc, client.ForkOptions{Count: 1, CPUs: 2})[0]
	mem := fork(t, ctx, sc, client.ForkOptions{Count: 1, WithMemory: true, CPUs: 2})[0]
	allowed("branch forked after the update", above.InitPid, "0")
	allowed("memory branch forked after the update", mem.InitPid, "0")

	// Wider again: the branches follow.
	update("0-1", 150000)
	for _, b := range []client.BranchInfo{limited, nested, above, mem} {
		allowed("branch "+b.ID+" after the update back to CPUs 0-1", b.InitPid, "0-1")
	}
	mustRun(t, ctx, sc, nested.ID, "sh", "-c", "echo nested > /state")
	if _, err := sc.Commit(ctx, nested.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Commit(ctx, plain.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "nested\n" {
		t.Fatalf("sandbox after the commits: %q %v", out, err)
	}
}
