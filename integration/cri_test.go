//go:build linux

package integration

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCRIPodLifecycle drives a pod on the branch runtime handler with
// crictl, as a kubelet would: run the pod, create and start a container,
// exec (streamed and synchronous), logs, stop, remove; and checks from
// containerd and the host that it ran on io.containerd.branch.v1 and the
// branch snapshotter and that nothing is left.
func TestCRIPodLifecycle(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("life", "branch", ns)

	m := c.inspect("inspectp", pod)
	if s := field(m, "status", "state"); s != "SANDBOX_READY" {
		t.Fatalf("pod state %v, want SANDBOX_READY", s)
	}
	if h := field(m, "status", "runtimeHandler"); h != "branch" {
		t.Errorf("pod runtime handler %v, want branch", h)
	}
	if rt, sn := c.containerInfo(pod); rt != criBranchType || sn != "branch" {
		t.Errorf("pod sandbox container runs on runtime %q, snapshotter %q; want %s on branch", rt, sn, criBranchType)
	}
	if shims := c.shims(); len(shims) != 1 || slices.Collect(maps.Values(shims))[0] != "containerd-shim-branch-v1" {
		t.Errorf("the pod's shims are %v, want one containerd-shim-branch-v1", shims)
	}

	ctr := c.createContainer(pod, podCfg, "app", ns, "/bin/sh", "-c",
		`trap 'echo bye; exit 0' TERM; echo hello from branch; echo to stderr >&2; sleep 1000 & wait`)
	if rt, sn := c.containerInfo(ctr); rt != criBranchType || sn != "branch" {
		t.Errorf("container runs on runtime %q, snapshotter %q; want %s on branch", rt, sn, criBranchType)
	}
	// The image was imported into overlayfs only: creating the container
	// unpacked it into branch, where the container's rootfs is.
	snaps, err := c.env.CtrIn(c.ctx, daemons.CRINamespace, "snapshots", "--snapshotter", "branch", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(snaps, ctr) || !strings.Contains(snaps, pod) {
		t.Errorf("branch snapshotter has no snapshot for the pod or container:\n%s", snaps)
	}
	if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
		t.Fatal(err)
	}
	if s := field(c.inspect("inspect", ctr), "status", "state"); s != "CONTAINER_RUNNING" {
		t.Fatalf("container state %v after start, want CONTAINER_RUNNING", s)
	}
	ps, err := c.env.Crictl(c.ctx, "ps", "-q", "--pod", pod)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(ps) != ctr {
		t.Errorf("crictl ps --pod lists %q, want %s", ps, ctr)
	}
	// Its processes are in the cgroup the pod's cgroup_parent asked for.
	pid := c.pidOf("inspect", ctr)
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cg), "/"+c.env.Namespace+"/"+ctr) {
		t.Errorf("container process %d is not in cgroup /%s/%s:\n%s", pid, c.env.Namespace, ctr, cg)
	}

	waitUntil(t, "the container's output in its log", 10*time.Second, func() bool {
		out, err := c.env.Crictl(c.ctx, "logs", ctr)
		return err == nil && strings.Contains(out, "hello from branch")
	})
	_, stderr, err := c.env.CrictlIn(c.ctx, "", "logs", ctr)
	if err != nil || !strings.Contains(stderr, "to stderr") {
		t.Errorf("crictl logs: stderr %q (%v), want the container's stderr line", stderr, err)
	}

	// Synchronous exec (ExecSync) and streamed exec (Exec through the
	// CRI streaming server) share the container's rootfs.
	if out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "sh", "-c", "echo $((6*7)) > /tmp/answer; cat /tmp/answer"); err != nil || strings.TrimSpace(out) != "42" {
		t.Errorf("exec -s: %q, %v; want 42", out, err)
	}
	if out, err := c.env.Crictl(c.ctx, "exec", ctr, "cat", "/tmp/answer"); err != nil || strings.TrimSpace(out) != "42" {
		t.Errorf("streamed exec: %q, %v; want 42", out, err)
	}
	if out, _, err := c.env.CrictlIn(c.ctx, "piped in\n", "exec", "-i", ctr, "cat"); err != nil || out != "piped in\n" {
		t.Errorf("streamed exec with stdin: %q, %v", out, err)
	}
	// A failing command's status reaches the client (crictl prints it and
	// exits 1).
	for _, sync := range []bool{true, false} {
		args := []string{"exec", ctr, "sh", "-c", "exit 3"}
		if sync {
			args = []string{"exec", "-s", ctr, "sh", "-c", "exit 3"}
		}
		_, stderr, err := c.env.CrictlIn(c.ctx, "", args...)
		if err == nil || !(strings.Contains(stderr, "exited with 3") || strings.Contains(stderr, "exit code 3")) {
			t.Errorf("crictl %v: %v, %q; want a failure naming exit status 3", args, err, stderr)
		}
	}

	// Stop sends SIGTERM first: the container's trap runs and it exits 0.
	procs := containerHostProcs(c.env.Namespace, ctr, pid)
	if _, err := c.env.Crictl(c.ctx, "stop", "--timeout", "10", ctr); err != nil {
		t.Fatal(err)
	}
	st := c.inspect("inspect", ctr)
	if s := field(st, "status", "state"); s != "CONTAINER_EXITED" {
		t.Errorf("container state %v after stop, want CONTAINER_EXITED", s)
	}
	if code, _ := field(st, "status", "exitCode").(float64); code != 0 {
		t.Errorf("exit code %v after a handled SIGTERM, want 0", code)
	}
	if out, err := c.env.Crictl(c.ctx, "logs", ctr); err != nil || !strings.Contains(out, "bye") {
		t.Errorf("log after stop: %q, %v; want the trap's line", out, err)
	}
	if left := survivors(procs); len(left) != 0 {
		t.Errorf("processes of the stopped container still alive: %v", left)
	}
	if _, err := c.env.Crictl(c.ctx, "rm", ctr); err != nil {
		t.Fatal(err)
	}
	if _, err := c.env.Crictl(c.ctx, "stopp", pod); err != nil {
		t.Fatal(err)
	}
	if _, err := c.env.Crictl(c.ctx, "rmp", pod); err != nil {
		t.Fatal(err)
	}

	// Nothing of the pod is left: containers, snapshots, shims, cgroups,
	// mounts, runtime state.
	if out, err := c.env.CtrIn(c.ctx, daemons.CRINamespace, "containers", "ls", "-q"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("containers left in %s: %q, %v", daemons.CRINamespace, out, err)
	}
	waitUntil(t, "the shim to exit", 10*time.Second, func() bool { return len(c.shims()) == 0 })
	snaps, err = c.env.CtrIn(c.ctx, daemons.CRINamespace, "snapshots", "--snapshotter", "branch", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(snaps, ctr) || strings.Contains(snaps, pod) {
		t.Errorf("snapshots of the removed pod left:\n%s", snaps)
	}
	for _, id := range []string{pod, ctr} {
		if dirs := containerCgroupDirs(c.env.Namespace, id); len(dirs) != 0 {
			t.Errorf("cgroups of %s left: %v", id, dirs)
		}
		if _, err := os.Stat(filepath.Join(runtimeRoot, daemons.CRINamespace, id)); err == nil {
			t.Errorf("runtime state of %s left", id)
		}
	}
	if m, _ := daemons.MountsUnder(c.env.ContainerdState); len(m) != 0 {
		t.Errorf("mounts left under containerd's state: %v", m)
	}
}

// TestCRIConfigParsed has containerd itself (`containerd config dump`)
// read docs/containerd-config.toml: the branch handler and its image
// platform come out as meant, and the default runc handler is still there.
func TestCRIConfigParsed(t *testing.T) {
	docs := filepath.Join(filepath.Dir(daemons.BinDirFromEnv()), "docs", "containerd-config.toml")
	cmd := exec.Command(filepath.Join(daemons.BinDirFromEnv(), "containerd"), "--config", docs, "config", "dump")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, out)
	}
	dump := string(out)
	for _, want := range []string{
		// runc-v2's type, so that the CRI passes runc's options and asks
		// for features, run by the branch shim (docs/cri.md).
		"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.branch]\n          runtime_type = 'io.containerd.runc.v2'\n          runtime_path = '/usr/local/bin/containerd-shim-branch-v1'",
		"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.branch.options]\n            SystemdCgroup = true\n",
		"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n          runtime_type = 'io.containerd.runc.v2'",
		"[plugins.'io.containerd.cri.v1.images'.runtime_platforms.branch]",
		"[proxy_plugins.branch]\n    type = 'snapshot'\n    address = '/run/containerd-branch-snapshotter/snapshotter.sock'",
		// The snapshotter id-maps user-namespaced pods' images (docs/userns.md).
		"    capabilities = ['remap-ids']\n",
		// What the CRI reports to the kubelet as the snapshotter's filesystem.
		"root = '/var/lib/containerd-branch-snapshotter'",
		"default_runtime_name = 'runc'",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("containerd's reading of the documented config lacks:\n%s", want)
		}
	}
	// The branch handler's own table: up to the next table header.
	section := ""
	if i := strings.Index(dump, "runtimes.branch]"); i >= 0 {
		section = dump[i:]
		for j, line := range strings.SplitAfter(section, "\n")[1:] {
			if strings.HasPrefix(strings.TrimSpace(line), "[") {
				section = strings.Join(strings.SplitAfter(section, "\n")[:j+1], "")
				break
			}
		}
	}
	if !strings.Contains(section, "snapshotter = 'branch'") || !strings.Contains(section, "sandboxer = 'podsandbox'") {
		t.Errorf("the branch handler's snapshotter or sandboxer is not as documented:\n%s", section)
	}
}
