//go:build linux

package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCRIMemoryRollback rolls a CRI container (a pod's, in the pod's
// network and IPC namespaces) back to a checkpoint taken with its
// processes: the processes go on from the checkpoint, and what the kubelet
// sees through the CRI (the pod, the container's state, start time,
// restart attempt, exit) does not change.
func TestCRIMemoryRollback(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsPod, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("memroll", "branch", ns)
	ctr := c.createContainer(pod, podCfg, "app", ns, "/bin/sh", "-c", `n=0; while :; do if [ -e /go ]; then rm /go; n=$((n+1)); echo "n=$n" > /count; fi; sleep 0.02; done`)
	if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
		t.Fatal(err)
	}
	step := func(want string) {
		t.Helper()
		if out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "touch", "/go"); err != nil {
			t.Fatalf("crictl exec: %v %s", err, out)
		}
		waitUntil(t, "the container to count "+want, 10*time.Second, func() bool {
			out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "cat", "/count")
			return err == nil && strings.TrimSpace(out) == want
		})
	}
	step("n=1")
	withoutPid := func() string {
		v := criView(t, c, ctr)
		i := strings.Index(v, " pid=")
		j := strings.Index(v, " started=")
		return v[:i] + v[j:]
	}
	before := withoutPid()
	if !strings.Contains(before, "state=CONTAINER_RUNNING") {
		t.Fatalf("container not running: %s", before)
	}
	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.Checkpoint(c.ctx, "", "one", client.CheckpointWithMemory()); err != nil {
		t.Fatalf("checkpoint of a pod's container with memory: %v", err)
	}
	step("n=2")
	if err := sc.Rollback(c.ctx, "", "one"); err != nil {
		t.Fatalf("rollback of a pod's container with memory: %v", err)
	}
	step("n=2")
	if now := withoutPid(); now != before {
		t.Fatalf("the CRI sees a change after the rollback:\nbefore: %s\nnow:    %s", before, now)
	}
}
