package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/cpuset"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestKubeletCPUManager: the kubelet's CPU manager with its static policy
// gives a Guaranteed container whole CPUs alone and narrows every other
// container's cpuset to the rest through the CRI's UpdateContainerResources
// (its reconcile loop). A branch pod's container with a live branch is
// narrowed, its branch with it: on cgroup v1 the update failed before
// 2026-12-07 (the kernel refused the container a cpuset without its
// branch's CPUs), and the branch pod went on running on the CPU the
// Guaranteed container was given alone.
func TestKubeletCPUManager(t *testing.T) {
	if runtime.NumCPU() < 2 { // the machines CI runs on have 2
		t.Skip("the static policy needs a CPU to reserve and one to give away")
	}
	k := kubeNodeWith(t, daemons.KubeConfig{CPUManagerStatic: true})
	// BestEffort: of the node's 2 CPUs, 1 is reserved, and the
	// Guaranteed pod below takes the other whole.
	k.apply(k.branchPod("shared", nil, "", container("main", criAppImage, "sh", "-c", watchScript)))
	id := k.waitRunning("shared").container("main").id()
	out, err := k.hostBranchctl("fork", id, "-n", "1", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var kids []client.BranchInfo
	if err := json.Unmarshal([]byte(out), &kids); err != nil || len(kids) != 1 {
		t.Fatalf("fork --json: %v %q", err, out)
	}
	sharedPid := k.pidOf("inspect", id)
	before := allowedCPUs(t, sharedPid)

	alone := container("main", criAppImage, "sh", "-c", "exec sleep 100000")
	alone["resources"] = map[string]any{
		"limits":   map[string]any{"cpu": "1", "memory": "64Mi"},
		"requests": map[string]any{"cpu": "1", "memory": "64Mi"},
	}
	k.apply(k.branchPod("exclusive", nil, "", alone))
	exclusive := allowedCPUs(t, k.pidOf("inspect", k.waitRunning("exclusive").container("main").id()))
	if exclusive.Size() != 1 {
		t.Fatalf("the Guaranteed container of 1 CPU may run on CPUs %s; want one of its own", exclusive)
	}
	want := before.Difference(exclusive)
	var got, branch cpuset.CPUSet
	for end := time.Now().Add(kubeWait(time.Minute)); ; time.Sleep(200 * time.Millisecond) {
		got, branch = allowedCPUs(t, sharedPid), allowedCPUs(t, kids[0].InitPid)
		if got.Equals(want) && branch.Equals(want) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the branch pod's container may run on CPUs %s and its branch on %s, the Guaranteed container on %s alone; want %s for both", got, branch, exclusive, want)
		}
	}
	if _, err := k.hostBranchctl("commit", id+"/"+kids[0].ID); err != nil {
		t.Fatalf("commit of the branch after its container's cpuset was narrowed: %v", err)
	}
	if w := k.warnings("shared"); len(w) > 0 {
		t.Errorf("warning events for the branch pod: %v", w)
	}
}

// allowedCPUs is the CPUs the process pid may run on.
func allowedCPUs(t *testing.T, pid int) cpuset.CPUSet {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			s, err := cpuset.Parse(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	t.Fatalf("process %d: no Cpus_allowed_list", pid)
	return cpuset.CPUSet{}
}
