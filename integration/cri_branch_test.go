//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/typeurl/v2"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// criView is what the kubelet sees of a pod through the CRI: the pods and
// containers listed, and of the branched container its state, pid, start
// time, restart attempt and exit.
func criView(t *testing.T, c *criTest, ctr string) string {
	t.Helper()
	pods, err := c.env.Crictl(c.ctx, "pods", "-q")
	if err != nil {
		t.Fatal(err)
	}
	ctrs, err := c.env.Crictl(c.ctx, "ps", "-a", "-q")
	if err != nil {
		t.Fatal(err)
	}
	st := c.inspect("inspect", ctr)
	return fmt.Sprintf("pods=%q containers=%q state=%v pid=%v started=%v attempt=%v finished=%v exit=%v reason=%v",
		strings.Fields(pods), strings.Fields(ctrs),
		field(st, "status", "state"), field(st, "info", "pid"), field(st, "status", "startedAt"),
		field(st, "status", "metadata", "attempt"), field(st, "status", "finishedAt"),
		field(st, "status", "exitCode"), field(st, "status", "reason"))
}

// TestCRIBranchPodContainer branches a CRI container (namespace k8s.io):
// fork, explore, a commit that wins, a loser, an abort, and a commit that
// the running container sees at once. Neither crictl ps nor crictl inspect
// shows a new container, a restart or an exit at any point.
func TestCRIBranchPodContainer(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("branchy", "branch", ns)
	ctr := c.createContainer(pod, podCfg, "app", ns, "/bin/sh", "-c", "echo before > /state && exec sleep 1000")
	if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the container to write its state", 10*time.Second, func() bool {
		out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "cat", "/state")
		return err == nil && strings.TrimSpace(out) == "before"
	})
	// A crictl user names the container as crictl shows it.
	for _, name := range []string{"app", "branchy/app", ctr[:8]} {
		if id, err := client.ResolveSandbox(c.ctx, c.env.Address, daemons.CRINamespace, name); err != nil || id != ctr {
			t.Fatalf("resolve %q: %q %v; want %s", name, id, err, ctr)
		}
	}
	before := criView(t, c, ctr)
	if !strings.Contains(before, "state=CONTAINER_RUNNING") {
		t.Fatalf("container not running: %s", before)
	}
	same := func(when string) {
		t.Helper()
		if now := criView(t, c, ctr); now != before {
			t.Fatalf("the CRI sees a change %s:\nbefore: %s\nnow:    %s", when, before, now)
		}
	}

	// Watch for what the CRI plugin would take as the container ending.
	evctx, stopEvents := context.WithCancel(namespaces.WithNamespace(c.ctx, daemons.CRINamespace))
	defer stopEvents()
	events, evErrs := c.client.EventService().Subscribe(evctx, `topic=="/tasks/exit"`, `topic=="/tasks/delete"`, `topic=="/tasks/oom"`)
	var exits []string
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		for {
			select {
			case e := <-events:
				v, err := typeurl.UnmarshalAny(e.Event)
				if err != nil {
					continue
				}
				switch ev := v.(type) {
				case *eventstypes.TaskExit:
					// An exec's exit (ID is the exec's) is the CRI's exec
					// machinery's business; the container's own init
					// exiting (ID is the container's) would end it.
					if ev.ContainerID == ctr && ev.ID == ctr {
						exits = append(exits, fmt.Sprintf("%s exit pid %d status %d", e.Topic, ev.Pid, ev.ExitStatus))
					}
				case *eventstypes.TaskDelete:
					if ev.ContainerID == ctr {
						exits = append(exits, e.Topic)
					}
				case *eventstypes.TaskOOM:
					if ev.ContainerID == ctr {
						exits = append(exits, e.Topic)
					}
				}
			case <-evErrs:
				return
			case <-evctx.Done():
				return
			}
		}
	}()

	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	kids, err := sc.Fork(c.ctx, client.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	same("after fork")
	for i, k := range kids {
		var out client.Output
		st, err := sc.Run(c.ctx, k.ID, client.ExecOptions{Args: []string{"sh", "-c", fmt.Sprintf("echo branch-%d > /state", i)}, Stdout: &out, Stderr: &out})
		if err != nil || st.Code != 0 {
			t.Fatalf("write in branch %s: %v %+v %s", k.ID, err, st, out.String())
		}
	}
	same("while branches explore")
	if _, err := sc.Commit(c.ctx, kids[1].ID); err != nil {
		t.Fatal(err)
	}
	same("after a commit")
	var se *branch.StaleError
	if _, err := sc.Commit(c.ctx, kids[0].ID); !errors.As(err, &se) || se.Winner != kids[1].ID {
		t.Fatalf("loser: %v", err)
	}
	if out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "cat", "/state"); err != nil || strings.TrimSpace(out) != "branch-1" {
		t.Fatalf("running container reads %q (%v) after the commit", out, err)
	}
	more, err := sc.Fork(c.ctx, client.ForkOptions{Count: 1, Args: []string{"sh", "-c", "exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Abort(c.ctx, more[0].ID); err != nil {
		t.Fatal(err)
	}
	same("after an abort")
	// The container writes again, and the CRI's own view is unchanged.
	if _, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "sh", "-c", "echo after > /state2"); err != nil {
		t.Fatalf("container not writable after its branches ended: %v", err)
	}
	same("at the end")
	stopEvents()
	<-evDone
	if len(exits) > 0 {
		t.Fatalf("containerd published task events for the container while its branches came and went: %v", exits)
	}

	// Deleting the pod with live branches leaves nothing behind.
	live, err := sc.Fork(c.ctx, client.ForkOptions{Count: 8, Args: []string{"sh", "-c", "exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, k := range live {
		if k.InitPid == 0 {
			t.Fatalf("branch %s has no init pid: %+v", k.ID, k)
		}
		pids = append(pids, k.InitPid)
	}
	if _, err := c.env.Crictl(c.ctx, "rmp", "--force", pod); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the branch processes to end", 10*time.Second, func() bool {
		for _, p := range pids {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err == nil {
				return false
			}
		}
		return true
	})
	waitUntil(t, "the branch layers to go", 10*time.Second, func() bool {
		entries, _ := os.ReadDir(filepath.Join(c.env.SnapshotterRoot, "branches"))
		return len(entries) == 0
	})
	if m, _ := daemons.MountsUnder(c.env.Dir); len(m) != 0 {
		t.Fatalf("mounts left after the pod went: %v", m)
	}
	if cg := c.env.ContainerCgroups(); len(cg) != 0 {
		t.Fatalf("cgroups left after the pod went: %v", cg)
	}
}
