//go:build linux

package integration

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/integration/harness"
)

// TestCRIShimKilled kills -9 the shim of a pod on the branch handler (one
// shim serves the pause container and both app containers, one of which
// has branches), then removes the pod with crictl as a kubelet would: no
// process, cgroup (on any hierarchy) or runtime state of the pod, its
// containers or the branches may remain. containerd runs the shim's
// cleanup only for the ids it knows a task of; runc-v2 leaves the app
// containers' cgroups and state behind here.
func TestCRIShimKilled(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("shimkill", "branch", ns)
	ids := []string{pod}
	var procs []hostProc
	for _, name := range []string{"a", "b"} {
		ctr := c.createContainer(pod, podCfg, name, ns, "sleep", "1000")
		if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ctr)
	}
	sc, err := branch.NewSandboxClient(c.ctx, c.env.Address, harness.CRINamespace, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	kids, err := sc.Fork(c.ctx, branch.ForkOptions{Count: 2})
	sc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 {
		t.Fatalf("forked %d branches, want 2", len(kids))
	}
	branchStates, _ := filepath.Glob(filepath.Join(runtimeRoot, harness.CRINamespace, ids[1]+".b*"))
	if len(branchStates) == 0 {
		t.Logf("branches started by the branch init keep no runtime state")
	}
	for _, id := range ids {
		procs = append(procs, containerHostProcs(harness.CRINamespace, id, 0)...)
		procs = append(procs, containerHostProcs(c.env.Namespace, id, 0)...)
		if len(containerCgroupDirs(c.env.Namespace, id)) == 0 {
			t.Fatalf("no cgroup of %s under /%s before the kill: the checks below would prove nothing", id, c.env.Namespace)
		}
	}
	if len(procs) < 5 { // pause, a, b and the two branch inits
		t.Fatalf("found %d processes of the pod before the kill, want at least 5: %v", len(procs), procs)
	}

	shims := c.shims()
	if len(shims) != 1 {
		t.Fatalf("shims %v, want the pod's one", shims)
	}
	for pid := range shims {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the shim to be gone", 10*time.Second, func() bool { return len(c.shims()) == 0 })

	if out, err := c.env.Crictl(c.ctx, "stopp", pod); err != nil {
		t.Logf("stopp after the shim's death: %v\n%s", err, out)
	}
	// Removal is retried, as a kubelet does: the CRI plugin takes the
	// containers for exited only once it handled their exit events again.
	waitUntil(t, "crictl rmp to remove the pod", 30*time.Second, func() bool {
		_, err := c.env.Crictl(c.ctx, "rmp", "--force", pod)
		return err == nil
	})

	waitUntil(t, "every process of the pod to end", 20*time.Second, func() bool { return len(survivors(procs)) == 0 })
	for _, id := range ids {
		if dirs := containerCgroupDirs(c.env.Namespace, id); len(dirs) != 0 {
			t.Errorf("cgroups of %s left: %v", id, dirs)
		}
		left, _ := filepath.Glob(filepath.Join(runtimeRoot, harness.CRINamespace, id+"*"))
		for _, s := range left {
			t.Errorf("runtime state %s left", s)
		}
		bundle := filepath.Join(c.env.ContainerdState, "io.containerd.runtime.v2.task", harness.CRINamespace, id)
		if m, _ := harness.MountsUnder(bundle); len(m) != 0 {
			t.Errorf("mounts of %s left: %v", id, m)
		}
		if _, err := os.Stat(bundle); err == nil {
			t.Errorf("bundle of %s left", id)
		}
	}
	for _, s := range branchStates {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("branch runtime state %s left", s)
		}
	}
}
