//go:build linux

package integration

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCRIShimKilled kills -9 the shim of a pod on the branch handler (one
// shim serves the pause container and both app containers, each with
// branches), then removes the pod with crictl as a kubelet would: no
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
	// a's branches are started by the branch init; b's by the runtime (a
	// recursive read-only mount keeps them off the init), with runtime
	// state of their own.
	a := c.createContainer(pod, podCfg, "a", ns, "sleep", "1000")
	cfg := c.writeJSON("b-container.json", map[string]any{
		"metadata": map[string]any{"name": "b", "attempt": 0},
		"image":    map[string]any{"image": criAppImage},
		"command":  []string{"sleep", "1000"},
		"log_path": "b.log",
		"mounts":   []map[string]any{{"container_path": "/data", "host_path": t.TempDir(), "readonly": true, "recursive_read_only": true}},
		"linux":    map[string]any{"security_context": map[string]any{"namespace_options": ns.options()}},
	})
	out, err := c.env.Crictl(c.ctx, "create", pod, cfg, podCfg)
	if err != nil {
		t.Fatal(err)
	}
	b := lastLine(out)
	c.ids = append(c.ids, b)
	ids = append(ids, a, b)
	for _, ctr := range []string{a, b} {
		if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
			t.Fatal(err)
		}
	}
	for ctr, n := range map[string]int{a: 2, b: 1} {
		sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
		if err != nil {
			t.Fatal(err)
		}
		kids, err := sc.Fork(c.ctx, client.ForkOptions{Count: n})
		sc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(kids) != n {
			t.Fatalf("forked %d branches, want %d", len(kids), n)
		}
	}
	branchStates, _ := filepath.Glob(filepath.Join(runtimeRoot, daemons.CRINamespace, b+".b*"))
	if len(branchStates) != 1 {
		t.Fatalf("runtime state of b's branch: %v, want one", branchStates)
	}
	for _, id := range ids {
		procs = append(procs, containerHostProcs(daemons.CRINamespace, id, 0)...)
		procs = append(procs, containerHostProcs(c.env.Namespace, id, 0)...)
		if len(containerCgroupDirs(c.env.Namespace, id)) == 0 {
			t.Fatalf("no cgroup of %s under /%s before the kill: the checks below would prove nothing", id, c.env.Namespace)
		}
	}
	if len(procs) < 6 { // pause, a, b and the three branch inits
		t.Fatalf("found %d processes of the pod before the kill, want at least 6: %v", len(procs), procs)
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
	c.assertGone(ids)
	for _, s := range branchStates {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("branch runtime state %s left", s)
		}
	}
}
