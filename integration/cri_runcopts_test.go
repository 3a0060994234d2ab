//go:build linux

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups/systemd"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fstest"
)

// TestCRIBranchFeatures checks that, through the CRI, the branch handler
// is asked for its features as the runc handler is (crictl info reports
// recursive read-only mounts for it), and that a container with a
// recursive read-only mount, the request that made containerd 2.2.1 panic
// on a handler without features, runs: its mount and the mount below it are
// read-only inside the container and in its branches, where a plain
// read-only mount of the same directory leaves the mount below writable.
func TestCRIBranchFeatures(t *testing.T) {
	c := criEnv(t)
	feats, out := c.handlerFeatures()
	if !feats["branch"].RecursiveReadOnlyMounts || !feats["runc"].RecursiveReadOnlyMounts {
		t.Fatalf("recursive read-only mounts by handler %v, want true for branch as for runc; crictl info:\n%s", feats, out)
	}

	// A host directory with a mount below it.
	data := t.TempDir()
	sub := filepath.Join(data, "sub")
	fstest.Tmpfs(t, sub, "size=1m")

	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("rro", "branch", ns)
	ctr := c.startFrom(pod, podCfg, "rro", map[string]any{
		"metadata": map[string]any{"name": "rro", "attempt": 0},
		"image":    map[string]any{"image": criAppImage},
		"command":  []string{"sleep", "1000"},
		"log_path": "rro.log",
		"mounts": []map[string]any{
			{"container_path": "/rro", "host_path": data, "readonly": true, "recursive_read_only": true},
			{"container_path": "/plain", "host_path": data, "readonly": true},
		},
		"linux": map[string]any{"security_context": map[string]any{"namespace_options": ns.options()}},
	})
	canWrite := func(path string, run func(...string) error) bool {
		return run("touch", path) == nil
	}
	inContainer := func(args ...string) error {
		_, err := c.env.Crictl(c.ctx, append([]string{"exec", "-s", ctr}, args...)...)
		return err
	}
	for path, want := range map[string]bool{"/rro/top": false, "/rro/sub/f": false, "/plain/top": false, "/plain/sub/f": true} {
		if got := canWrite(path, inContainer); got != want {
			t.Errorf("in the container, writing %s succeeded: %v, want %v", path, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(sub, "f")); err != nil {
		t.Errorf("the write through the plain read-only mount's submount is not on the host: %v", err)
	}

	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	kids, err := sc.Fork(c.ctx, client.ForkOptions{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	inBranch := func(args ...string) error {
		st, err := sc.Run(c.ctx, kids[0].ID, client.ExecOptions{Args: args})
		if err == nil && st.Code != 0 {
			return os.ErrPermission
		}
		return err
	}
	if err := inBranch("test", "-d", "/rro/sub"); err != nil {
		t.Fatalf("the branch does not see the mount: %v", err)
	}
	for path, want := range map[string]bool{"/rro/top": false, "/rro/sub/g": false} {
		if got := canWrite(path, inBranch); got != want {
			t.Errorf("in the branch, writing %s succeeded: %v, want %v", path, got, want)
		}
	}
	if _, err := sc.Abort(c.ctx, kids[0].ID); err != nil {
		t.Error(err)
	}
	// containerd is still there to answer.
	if _, err := c.env.Crictl(c.ctx, "version"); err != nil {
		t.Errorf("containerd no longer answers: %v", err)
	}
}

// TestCRIBranchSystemdCgroup runs the branch handler with the runc option
// SystemdCgroup = true, as docs/containerd-config.toml has it for a
// kubeadm-style node: the option reaches the shim. This host's init is not
// systemd, so the shim refuses the pod with the fix, instead of the
// runtime failing on systemd's bus later (the systemd driver's own test
// runs a pod in a VM whose init is systemd).
//
// Where systemd is the init (the cgroup-v2 VM), a pod runs with it: its
// container's branch gets its own limited cgroup inside the container's
// scope, and nothing of either is left once the branch and the pod end.
func TestCRIBranchSystemdCgroup(t *testing.T) {
	requireRoot(t)
	if systemd.IsRunningSystemd() {
		testCRISystemdPod(t)
		return
	}
	c := criEnvWith(t, daemons.CRIConfig{SystemdCgroup: true})
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	cfg := systemdPodConfig(c, ns, "kubepods.slice")
	out, err := c.env.Crictl(c.ctx, "runp", "--runtime", "branch", cfg)
	if err == nil {
		c.ids = append(c.ids, lastLine(out))
		t.Fatalf("a pod with SystemdCgroup = true ran on a host whose init is not systemd")
	}
	if !strings.Contains(err.Error(), "runtime option SystemdCgroup = true, but systemd is not this host's init") {
		t.Errorf("runp failed, but not with the shim's refusal of SystemdCgroup:\n%v", err)
	}
	// The runc handler of the same containerd has no such option.
	id, _ := c.runPod("plain", "runc", ns)
	if s := field(c.inspect("inspectp", id), "status", "state"); s != "SANDBOX_READY" {
		t.Errorf("runc pod state %v, want SANDBOX_READY", s)
	}
}

func testCRISystemdPod(t *testing.T) {
	c := criEnvWith(t, daemons.CRIConfig{SystemdCgroup: true})
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	cfg := systemdPodConfig(c, ns, "bbxcri.slice")
	out, err := c.env.Crictl(c.ctx, "runp", "--runtime", "branch", cfg)
	if err != nil {
		t.Fatalf("a pod with SystemdCgroup = true on a host whose init is systemd: %v", err)
	}
	pod := lastLine(out)
	c.ids = append(c.ids, pod)
	ctr := c.createContainer(pod, cfg, "app", ns, "/bin/sh", "-c", "exec sleep 1000")
	if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
		t.Fatal(err)
	}
	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	kids, err := sc.Fork(c.ctx, client.ForkOptions{Count: 1, Memory: 32 << 20})
	if err != nil {
		t.Fatalf("fork in a pod under the systemd driver: %v", err)
	}
	k := kids[0]
	// The container's cgroup is its scope in the pod's slice, the
	// branch's a cgroup inside it with its own limit.
	if !strings.Contains(k.Cgroup, "bbxcri.slice/") || !strings.Contains(k.Cgroup, ".scope/") {
		t.Errorf("branch cgroup %q: want it inside the container's scope in bbxcri.slice", k.Cgroup)
	}
	branchDir := filepath.Join("/sys/fs/cgroup", k.Cgroup)
	if b, err := os.ReadFile(filepath.Join(branchDir, "memory.max")); err != nil || strings.TrimSpace(string(b)) != "33554432" {
		t.Errorf("branch memory.max %q (%v), want 33554432", b, err)
	}
	if got := mustRun(t, c.ctx, sc, k.ID, "sh", "-c", "echo ok > /x && cat /x"); got != "ok\n" {
		t.Errorf("run in the branch: %q", got)
	}
	if _, err := sc.Abort(c.ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	// Gone within the 10 s every abort test allows (assertBranchGone).
	waitUntil(t, "the branch cgroup to go after abort", 10*time.Second, func() bool {
		_, err := os.Stat(branchDir)
		return os.IsNotExist(err)
	})
	scope := branchDir
	for filepath.Ext(scope) != ".scope" && scope != "/sys/fs/cgroup" {
		scope = filepath.Dir(scope)
	}
	if _, err := c.env.Crictl(c.ctx, "rmp", "--force", pod); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the container's scope to go", 20*time.Second, func() bool {
		_, err := os.Stat(scope)
		return os.IsNotExist(err)
	})
}

// systemdPodConfig writes the config of pod "sd" under the systemd cgroup
// driver, whose pod parent is a slice (as kubelet's), and returns its path.
func systemdPodConfig(c *criTest, ns podNS, slice string) string {
	return c.writeJSON("sd-pod.json", map[string]any{
		"metadata":      map[string]any{"name": "sd", "namespace": "default", "uid": "sd-uid", "attempt": 0},
		"log_directory": filepath.Join(c.dir, "logs", "sd"),
		"linux": map[string]any{
			"cgroup_parent":    slice,
			"security_context": map[string]any{"namespace_options": ns.options()},
		},
	})
}
