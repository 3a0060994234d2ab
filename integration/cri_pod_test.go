//go:build linux

package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// criHandler is a runtime handler, the runtime it names and its shim.
type criHandler struct{ handler, runtime, shim string }

// criHandlers are the runtime handlers compared side by side: ours, and
// containerd's default runc-v2 with Debian's runc.
func criHandlers() []criHandler {
	return []criHandler{
		{"branch", criBranchType, "containerd-shim-branch-v1"},
		{"runc", "io.containerd.runc.v2", "containerd-shim-runc-v2"},
	}
}

// TestCRIPodSharesNamespaces runs the same pod on the branch and runc
// handlers at once (a pod network from the test CNI plugin, pod IPC, pod
// PID namespace; containers a and b share the pod's PID namespace, c asks
// for its own) and checks
// from the host, in /proc/<pid>/ns, that each container shares exactly
// what it does under runc-v2; and that, as with runc-v2, one shim process
// serves each whole pod and is the parent of all its containers.
func TestCRIPodSharesNamespaces(t *testing.T) {
	c := criEnv(t)
	handlers := criHandlers()
	podNSOpts := podNS{network: nsPod, pid: nsPod, ipc: nsPod}
	nsKinds := []string{"net", "ipc", "pid", "uts", "mnt"}
	hostNS := map[string]string{}
	for _, k := range nsKinds {
		l, err := os.Readlink("/proc/self/ns/" + k)
		if err != nil {
			t.Fatal(err)
		}
		hostNS[k] = l
	}

	type pod struct {
		id   string
		pids map[string]int // sandbox, a, b, c
	}
	pods := map[string]*pod{}
	for _, h := range handlers {
		id, cfg := c.runPod("share-"+h.handler, h.handler, podNSOpts)
		p := &pod{id: id, pids: map[string]int{"sandbox": c.pidOf("inspectp", id)}}
		if ip := field(c.inspect("inspectp", id), "status", "network", "ip"); ip != criPodIP {
			t.Errorf("%s: pod IP %v, want %s from the CNI plugin", h.handler, ip, criPodIP)
		}
		for _, name := range []string{"a", "b", "c"} {
			ns := podNSOpts
			if name == "c" {
				ns.pid = nsContainer
			}
			ctr := c.createContainer(id, cfg, h.handler+"-"+name, ns, "sleep", "1000")
			if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
				t.Fatal(err)
			}
			p.pids[name] = c.pidOf("inspect", ctr)
			if rt, sn := c.containerInfo(ctr); rt != h.runtime {
				t.Errorf("%s: container %s on runtime %q (snapshotter %q), want %s", h.handler, name, rt, sn, h.runtime)
			}
			// Both record runc-v2's type: the branches are found
			// by asking the shim, and runc's has none.
			if name == "a" {
				sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
				switch {
				case h.handler == "branch" && err != nil:
					t.Errorf("branch: container a is not taken as a sandbox: %v", err)
				case h.handler != "branch" && (!errdefs.IsFailedPrecondition(err) || !strings.Contains(fmt.Sprint(err), "runc's shim")):
					t.Errorf("%s: container a taken as a sandbox, or refused for another reason: %v", h.handler, err)
				}
				if err == nil {
					sc.Close()
				}
			}
			// The pause container is PID 1 of the pod's PID namespace.
			init, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "cat", "/proc/1/cmdline")
			if err != nil {
				t.Fatal(err)
			}
			want := "/pause"
			if name == "c" {
				want = "sleep\x001000"
			}
			if strings.TrimRight(init, "\x00\n") != want {
				t.Errorf("%s: PID 1 seen from container %s is %q, want %q", h.handler, name, init, want)
			}
			// The pod's network: the interface the CNI plugin made.
			addr, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "ip", "-o", "-4", "addr", "show", "eth0")
			if err != nil || !strings.Contains(addr, criPodIP+"/24") {
				t.Errorf("%s: container %s sees no pod network: %q, %v", h.handler, name, addr, err)
			}
		}
		pods[h.handler] = p
	}

	// What each process shares, relative to its pod's sandbox and the host.
	relation := func(p *pod, who, kind string) string {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", p.pids[who], kind))
		if err != nil {
			t.Fatal(err)
		}
		sandbox, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", p.pids["sandbox"], kind))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ns == hostNS[kind]:
			return "host"
		case who != "sandbox" && ns == sandbox:
			return "pod"
		default:
			return "own"
		}
	}
	want := map[string]map[string]string{
		"sandbox": {"net": "own", "ipc": "own", "pid": "own", "uts": "own", "mnt": "own"},
		"a":       {"net": "pod", "ipc": "pod", "pid": "pod", "uts": "pod", "mnt": "own"},
		"b":       {"net": "pod", "ipc": "pod", "pid": "pod", "uts": "pod", "mnt": "own"},
		"c":       {"net": "pod", "ipc": "pod", "pid": "own", "uts": "pod", "mnt": "own"},
	}
	got := map[string]map[string]map[string]string{}
	for _, h := range handlers {
		got[h.handler] = map[string]map[string]string{}
		for who := range want {
			got[h.handler][who] = map[string]string{}
			for _, k := range nsKinds {
				got[h.handler][who][k] = relation(pods[h.handler], who, k)
			}
		}
	}
	for who, kinds := range want {
		for k, w := range kinds {
			if b, r := got["branch"][who][k], got["runc"][who][k]; b != w || r != w {
				t.Errorf("%s namespace of %s: branch %s, runc %s; want %s", k, who, b, r, w)
			}
		}
	}
	// The two pods share nothing of their own with each other.
	for _, k := range []string{"net", "ipc", "pid", "uts", "mnt"} {
		b, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pods["branch"].pids["sandbox"], k))
		r, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pods["runc"].pids["sandbox"], k))
		if b == r {
			t.Errorf("the two pods share their %s namespace %s", k, b)
		}
	}

	// One shim per pod, grouped by sandbox id (runc-v2's manager does it
	// and ours is that manager), parent of the pod's every container.
	shims := c.shims()
	if len(shims) != len(handlers) {
		t.Errorf("shims running: %v; want one per pod", shims)
	}
	for _, h := range handlers {
		var shim int
		for pid, bin := range shims {
			if bin == h.shim {
				if shim != 0 {
					t.Errorf("%s: more than one shim: %d and %d", h.handler, shim, pid)
				}
				shim = pid
			}
		}
		if shim == 0 {
			t.Errorf("%s: no %s running", h.handler, h.shim)
			continue
		}
		if args := cmdline(shim); !strings.Contains(args, " -id "+pods[h.handler].id+" ") {
			t.Errorf("%s: shim %d is not the pod's (grouped by sandbox id %s): %s", h.handler, shim, pods[h.handler].id, args)
		}
		for who, pid := range pods[h.handler].pids {
			if parent, err := ppid(pid); err != nil || parent != shim {
				t.Errorf("%s: parent of %s (pid %d) is %d (%v), want the pod's shim %d", h.handler, who, pid, parent, err, shim)
			}
		}
	}

	// Removing the pods ends every process of theirs and both shims.
	var procs []hostProc
	for _, p := range pods {
		for _, pid := range p.pids {
			if start, ok := procStart(pid); ok {
				procs = append(procs, hostProc{pid: pid, start: start})
			}
		}
		if _, err := c.env.Crictl(c.ctx, "stopp", p.id); err != nil {
			t.Fatal(err)
		}
		if _, err := c.env.Crictl(c.ctx, "rmp", p.id); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the pods' processes and shims to end", 10*time.Second, func() bool {
		return len(survivors(procs)) == 0 && len(c.shims()) == 0
	})
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(string(b), "\x00", " ")
}
