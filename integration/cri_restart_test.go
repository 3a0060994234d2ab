//go:build linux

package integration

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCRIContainerdRestart: containerd, with its CRI plugin, restarted
// under a pod on the branch handler whose container has live branches,
// as a kubelet node's containerd is upgraded: the CRI plugin recovers the
// pod and container as ready and running, a client finds the container's
// branches and forks again, crictl execs into the container, and the pod
// is stopped and removed as a kubelet would, leaving nothing.
func TestCRIContainerdRestart(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("restart", "branch", ns)
	a := c.createContainer(pod, podCfg, "a", ns, "sleep", "1000")
	if _, err := c.env.Crictl(c.ctx, "start", a); err != nil {
		t.Fatal(err)
	}
	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, a)
	if err != nil {
		t.Fatal(err)
	}
	kids, err := sc.Fork(c.ctx, client.ForkOptions{Count: 2})
	sc.Close()
	if err != nil {
		t.Fatal(err)
	}
	var procs []hostProc
	for _, id := range []string{pod, a} {
		procs = append(procs, containerHostProcs(daemons.CRINamespace, id, 0)...)
		procs = append(procs, containerHostProcs(c.env.Namespace, id, 0)...)
	}
	if len(procs) < 4 { // pause, a and the two branch inits
		t.Fatalf("found %d processes of the pod, want at least 4: %v", len(procs), procs)
	}

	if err := c.env.StopContainerd(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := c.env.StartContainerd(c.ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the pod ready after the restart", 30*time.Second, func() bool {
		out, err := c.env.Crictl(c.ctx, "pods", "--id", pod, "-q", "--state", "ready")
		return err == nil && strings.TrimSpace(out) == pod
	})
	if out, err := c.env.Crictl(c.ctx, "ps", "--id", a, "-q", "--state", "running"); err != nil || strings.TrimSpace(out) != a {
		t.Fatalf("container a running after the restart: %q %v", out, err)
	}
	sc, err = client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, a)
	if err != nil {
		t.Fatalf("the container as a sandbox after the restart: %v", err)
	}
	defer sc.Close()
	nodes, err := sc.Tree(c.ctx)
	if err != nil || len(nodes) != 3 {
		t.Fatalf("branches after the restart: %v %v, want the container and its 2", nodes, err)
	}
	if _, err := sc.Fork(c.ctx, client.ForkOptions{Parent: kids[0].ID, Count: 1}); err != nil {
		t.Fatalf("fork after the restart: %v", err)
	}
	if out, err := c.env.Crictl(c.ctx, "exec", a, "echo", "hi"); err != nil || strings.TrimSpace(out) != "hi" {
		t.Fatalf("crictl exec after the restart: %q %v", out, err)
	}
	if _, err := c.env.Crictl(c.ctx, "stopp", pod); err != nil {
		t.Fatal(err)
	}
	if _, err := c.env.Crictl(c.ctx, "rmp", pod); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every process of the pod to end", 20*time.Second, func() bool { return len(survivors(procs)) == 0 })
	c.assertGone([]string{pod, a})
}
