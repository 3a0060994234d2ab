//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// requireKubernetesFull skips the long Kubernetes tests unless make
// test-kubernetes runs them (make test runs TestKubeletBranchPod only).
func requireKubernetesFull(t *testing.T) {
	t.Helper()
	if os.Getenv("BRANCHBOX_TEST_KUBERNETES") != "full" {
		t.Skip("make test-kubernetes runs this (BRANCHBOX_TEST_KUBERNETES=full)")
	}
}

// watchScript is a pod's main process that reports on its standard
// output (kubectl logs) every change of /state it reads: what a commit
// into its running container looks like from inside.
const watchScript = `echo before > /state; last=; while :; do s=$(cat /state); [ "$s" = "$last" ] || echo "state: $s"; last=$s; sleep 0.2; done`

// TestKubeletBranchPod is the short Kubernetes test of make test: a pod
// with runtimeClassName: branch run by a real kubelet through the API
// server (kubectl), exec and logs through the kubelet, and a fork of its
// container by branchctl on the host whose commit the pod's running
// process sees, while the API server's view of the pod stays the same:
// no restart, no exit, same container, still ready; an in-place resize
// of the container with a live branch, and the kubelet's checkpoint.
func TestKubeletBranchPod(t *testing.T) {
	k := kubeNode(t)
	ctr := container("main", criAppImage, "sh", "-c", watchScript)
	ctr["readinessProbe"] = map[string]any{"exec": map[string]any{"command": []string{"cat", "/state"}}, "periodSeconds": 1}
	ctr["resources"] = map[string]any{
		"limits":   map[string]any{"cpu": "500m", "memory": "128Mi"},
		"requests": map[string]any{"cpu": "100m", "memory": "128Mi"},
	}
	k.apply(k.branchPod("app", nil, "", ctr))
	p := k.waitRunning("app")
	// The RuntimeClass's scheduling reached the pod (RuntimeClass admission).
	if p.Spec.NodeSelector["branchbox.io/runtime"] != "branch" {
		t.Errorf("pod nodeSelector %v: the RuntimeClass's is not there", p.Spec.NodeSelector)
	}
	st := p.container("main")
	k.checkOnBranch(st.id())
	k.checkCgroup(st.id())
	if out, err := k.exec("app", "main", "cat", "/state"); err != nil || strings.TrimSpace(out) != "before" {
		t.Fatalf("kubectl exec: %q %v", out, err)
	}
	k.waitLogs("app", "main", "state: before")
	k.forkCommitFromHost("app", "main", "from-branch")
	k.checkStats("app", "main")
	k.resizeWithBranch("app", "main")
	if w := k.warnings("app"); len(w) > 0 {
		t.Errorf("warning events for the pod: %v", w)
	}
	// Last: containerd pauses the container for the dump, and an exec
	// probe in that window errors, as with runc (a warning event).
	k.checkpointThroughKubelet("app", "main")
}

// resizeWithBranch resizes a pod's container in place (the pod's resize
// subresource: the kubelet's UpdateContainerResources through the CRI)
// while it has a live branch with a CPU limit of its own as large as the
// container's: down to below the branch's, and up again. The kubelet
// reports the new limits, the container sees its new quota, and the
// branch lives on. On cgroup v1 the update failed before (the kernel
// refused the container a quota below its branch's), and the kubelet
// retried it with a warning until the branch ended.
func (k *kubeTest) resizeWithBranch(pod, ctr string) {
	k.t.Helper()
	id := k.pod(pod).container(ctr).id()
	kids := k.hostFork(id, 1, "--cpus", "0.5")
	before := k.pod(pod).container(ctr).view()
	for _, cpu := range []string{"200m", "500m"} {
		k.kubectl("patch", "pod", pod, "--subresource", "resize", "--type", "strategic",
			"-p", fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"resources":{"limits":{"cpu":%q}}}]}}`, ctr, cpu))
		waitUntil(k.t, "the kubelet to report the container's cpu limit "+cpu, kubeWait(time.Minute), func() bool {
			got, err := k.kube.Kubectl(k.ctx, "", "get", "pod", pod, "-o",
				`jsonpath={.status.containerStatuses[0].resources.limits.cpu} {.status.conditions[?(@.type=="PodResizeInProgress")].status}`)
			return err == nil && strings.TrimSpace(got) == cpu
		})
		quota, err := k.exec(pod, ctr, "sh", "-c", "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us")
		if want := strings.TrimSuffix(cpu, "m") + "00"; err != nil || strings.Fields(quota)[0] != want {
			k.t.Errorf("the container's quota after its resize to %s: %q %v; want %s", cpu, quota, err, want)
		}
	}
	k.stays(pod, ctr, before, "after the resizes")
	if _, err := k.hostBranchctl("exec", id+"/"+kids[0].ID, "--", "true"); err != nil {
		k.t.Errorf("the branch after its container's resizes: %v", err)
	}
	if _, err := k.hostBranchctl("abort", id+"/"+kids[0].ID); err != nil {
		k.t.Fatal(err)
	}
}

// checkpointThroughKubelet checkpoints a pod's container through the
// kubelet's checkpoint API (forensic container checkpointing, on by default
// since Kubernetes 1.30), reached through the API server's node proxy, while
// the container has a live branch: the archive is written, and the
// container runs on, not restarted, its branch alive.
func (k *kubeTest) checkpointThroughKubelet(pod, ctr string) {
	k.t.Helper()
	id := k.pod(pod).container(ctr).id()
	kids := k.hostFork(id, 1)
	empty := filepath.Join(k.dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		k.t.Fatal(err)
	}
	out := k.kubectl("create", "--raw", "/api/v1/nodes/"+k.kube.Node+"/proxy/checkpoint/default/"+pod+"/"+ctr, "-f", empty)
	var resp struct{ Items []string }
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Items) != 1 {
		k.t.Fatalf("the kubelet's checkpoint reply %q: %v", out, err)
	}
	if fi, err := os.Stat(resp.Items[0]); err != nil || fi.Size() == 0 {
		k.t.Fatalf("the checkpoint archive %s: %v", resp.Items[0], err)
	}
	st := k.pod(pod).container(ctr)
	if st.RestartCount != 0 || st.State.Running == nil || st.id() != id {
		k.t.Fatalf("the container after its checkpoint: %s", st.view())
	}
	tree, err := k.hostBranchctl("tree", id, "--json")
	var nodes []client.BranchInfo
	if err == nil {
		err = json.Unmarshal([]byte(tree), &nodes)
	}
	live := false
	for _, n := range nodes {
		live = live || n.ID == kids[0].ID && n.State == branch.Live
	}
	if err != nil || !live {
		k.t.Fatalf("its branch %s after the checkpoint: %v\n%s", kids[0].ID, err, tree)
	}
	if _, err := k.hostBranchctl("abort", id+"/"+kids[0].ID); err != nil {
		k.t.Fatal(err)
	}
}

// checkStats checks that the kubelet's stats summary (what eviction and
// kubectl top read) has the pod's container with its memory in use: the
// CRI reports the branch snapshotter's filesystem, as the documented
// containerd configuration has it export its root, or the whole summary
// fails.
func (k *kubeTest) checkStats(pod, ctr string) {
	k.t.Helper()
	waitUntil(k.t, "the kubelet's stats summary to have "+pod+"/"+ctr, kubeWait(30*time.Second), func() bool {
		c := k.containerStats(pod, ctr)
		return c != nil && c.Memory.WorkingSetBytes > 0 && c.Rootfs != nil && c.Rootfs.UsedBytes != nil
	})
}

// rootfsUsed is the root filesystem's bytes in use of a pod's container as
// the kubelet's stats summary has them (what its ephemeral-storage
// eviction reads), 0 if not there.
func (k *kubeTest) rootfsUsed(pod, ctr string) uint64 {
	if c := k.containerStats(pod, ctr); c != nil && c.Rootfs != nil && c.Rootfs.UsedBytes != nil {
		return *c.Rootfs.UsedBytes
	}
	return 0
}

// kubeContainerStats is a container of the kubelet's stats summary.
type kubeContainerStats struct {
	Name   string `json:"name"`
	Memory struct {
		WorkingSetBytes uint64 `json:"workingSetBytes"`
	} `json:"memory"`
	Rootfs *struct {
		UsedBytes *uint64 `json:"usedBytes"`
	} `json:"rootfs"`
}

// containerStats is a pod's container in the kubelet's stats summary, nil
// if it is not there (yet).
func (k *kubeTest) containerStats(pod, ctr string) *kubeContainerStats {
	var summary struct {
		Pods []struct {
			PodRef struct {
				Name string `json:"name"`
			} `json:"podRef"`
			Containers []kubeContainerStats `json:"containers"`
		} `json:"pods"`
	}
	out, err := k.kube.Kubectl(k.ctx, "", "get", "--raw", "/api/v1/nodes/"+k.kube.Node+"/proxy/stats/summary")
	if err != nil || json.Unmarshal([]byte(out), &summary) != nil {
		return nil
	}
	for _, p := range summary.Pods {
		for i, c := range p.Containers {
			if p.PodRef.Name == pod && c.Name == ctr {
				return &p.Containers[i]
			}
		}
	}
	return nil
}

// checkCgroup checks that a container's process is in the cgroup the
// kubelet's driver gives it: in the pod's slice under kubepods.slice, in
// a scope of its own (systemd), or under the kubelet's kubepods (cgroupfs).
func (k *kubeTest) checkCgroup(id string) {
	k.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", k.pidOf("inspect", id)))
	if err != nil {
		k.t.Fatal(err)
	}
	var path string
	for _, l := range strings.Split(string(b), "\n") {
		// The unified hierarchy's line on v2, the memory controller's on v1.
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && (f[0] == "0" && f[1] == "" || strings.Contains(f[1], "memory")) {
			path = f[2]
			if f[1] != "" {
				break
			}
		}
	}
	want := "/" + k.env.Namespace + "/kubepods/"
	if k.systemd {
		want = "/kubepods.slice/"
	}
	if !strings.Contains(path, want) || k.systemd && !strings.Contains(path, "/cri-containerd-"+id+".scope") {
		k.t.Fatalf("container %s is in cgroup %q; want it under %s (the kubelet's %s driver)", id, path, want, map[bool]string{true: "systemd", false: "cgroupfs"}[k.systemd])
	}
	k.t.Logf("container in cgroup %s", path)
}

// checkOnBranch checks that a CRI container runs on the branch shim with
// the branch snapshotter.
func (k *kubeTest) checkOnBranch(id string) {
	k.t.Helper()
	rt, snap := k.containerInfo(id)
	if rt != criBranchType || snap != "branch" {
		k.t.Fatalf("container %s: runtime %s, snapshotter %s; want the branch handler's", id, rt, snap)
	}
	branchShims := 0
	for _, name := range k.shims() {
		if name == "containerd-shim-branch-v1" {
			branchShims++
		}
	}
	if branchShims == 0 {
		k.t.Fatalf("no branch shim runs the pod: %v", k.shims())
	}
}

// waitLogs waits until a container's log (kubectl logs) holds want.
func (k *kubeTest) waitLogs(pod, ctr, want string) {
	k.t.Helper()
	var out string
	var err error
	for deadline := time.Now().Add(kubeWait(30 * time.Second)); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if out, err = k.kube.Kubectl(k.ctx, "", "logs", pod, "-c", ctr); err == nil && strings.Contains(out, want) {
			return
		}
	}
	k.t.Fatalf("no %q in the logs of %s/%s: %v\n%s", want, pod, ctr, err, lastLines(out, 20))
}

// stays checks that the API server's view of a container stays as it
// was for a while (several of the kubelet's relists and probe periods),
// and returns the view.
func (k *kubeTest) stays(pod, ctr, want, when string) {
	k.t.Helper()
	window := 4 * time.Second
	if daemons.Emulated() {
		// Still several of the kubelet's relists and probe periods.
		window = 20 * time.Second
	}
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if now := k.pod(pod).container(ctr).view(); now != want {
			k.t.Fatalf("the API server's view of %s/%s changed %s:\nbefore: %s\nnow:    %s", pod, ctr, when, want, now)
		}
	}
}

// forkCommitFromHost forks a pod's running container with branchctl on
// the host (namespace k8s.io, the container named by its id), writes
// value to /state in one branch, commits it and aborts the other, and
// checks that the pod's process (watchScript) sees the value, and that
// the API server's view of the container does not change at any point.
func (k *kubeTest) forkCommitFromHost(pod, ctr, value string) {
	k.t.Helper()
	st := k.pod(pod).container(ctr)
	before := st.view()
	if st.State.Running == nil || st.RestartCount != 0 || !st.Ready {
		k.t.Fatalf("container %s/%s not running and ready before the fork: %s", pod, ctr, before)
	}
	id := st.id()
	kids := k.hostFork(id, 2)
	k.stays(pod, ctr, before, "after the fork")
	if _, err := k.hostBranchctl("exec", id+"/"+kids[0].ID, "--", "sh", "-c", "echo "+value+" > /state"); err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.hostBranchctl("commit", id+"/"+kids[0].ID); err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.hostBranchctl("abort", id+"/"+kids[1].ID); err == nil {
		k.t.Fatalf("abort of the sibling of the winner: want its stale error")
	}
	// The running process, not a new one, reads the committed file.
	k.waitLogs(pod, ctr, "state: "+value)
	if out, err := k.exec(pod, ctr, "cat", "/state"); err != nil || strings.TrimSpace(out) != value {
		k.t.Fatalf("kubectl exec after the commit: %q %v", out, err)
	}
	k.stays(pod, ctr, before, "after the commit")
	// The container is writable again once its branches are gone.
	if _, err := k.exec(pod, ctr, "sh", "-c", "echo again > /other"); err != nil {
		k.t.Fatalf("container not writable after its branches ended: %v", err)
	}
}

// TestKubernetesNode runs pods on the branch RuntimeClass through a real
// kubelet and API server: probes (readiness and liveness, and the kubelet
// restarting a container whose liveness fails), resource limits, restart
// on failure (with an emptyDir that outlives the container), delete and
// recreate, a pod that forks and commits itself through the in-sandbox
// API, a fork and commit from the host that the pod's process sees, and a
// pod deleted with live branches. The kubelet's view (restart counts,
// container state, readiness, warning events) is checked throughout.
func TestKubernetesNode(t *testing.T) {
	requireKubernetesFull(t)
	k := kubeNode(t)

	t.Run("probes-limits", func(t *testing.T) {
		k := k.with(t)
		c := container("main", criAppImage, "sh", "-c", "touch /alive; "+watchScript)
		c["readinessProbe"] = map[string]any{"exec": map[string]any{"command": []string{"test", "-e", "/ready"}}, "periodSeconds": 1}
		c["livenessProbe"] = map[string]any{"exec": map[string]any{"command": []string{"test", "-e", "/alive"}}, "periodSeconds": 1, "failureThreshold": 2}
		c["resources"] = map[string]any{
			"limits":   map[string]any{"memory": "64Mi", "cpu": "250m"},
			"requests": map[string]any{"memory": "64Mi", "cpu": "250m"},
		}
		k.apply(k.branchPod("probed", nil, "", c))
		p := k.waitPod("probed", "running, not ready", time.Minute, func(p kubePod) bool {
			return p.Status.Phase == "Running" && p.container("main").State.Running != nil
		})
		if p.condition("Ready") == "True" {
			t.Fatalf("pod ready before its readiness probe can pass")
		}
		k.checkOnBranch(p.container("main").id())
		if _, err := k.exec("probed", "main", "touch", "/ready"); err != nil {
			t.Fatal(err)
		}
		k.waitRunning("probed")
		// The limits, as the container sees its own cgroup.
		limits, err := k.exec("probed", "main", "sh", "-c",
			"cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(limits); len(f) < 2 || f[0] != "67108864" || f[1] != "25000" {
			t.Errorf("container's memory and cpu limits %q; want 67108864 and a 25000us quota", limits)
		}
		// Branches come and go while the probes run: the kubelet sees
		// nothing of them.
		k.forkCommitFromHost("probed", "main", "probed-branch")
		// A failing liveness probe: the kubelet restarts the container.
		if _, err := k.exec("probed", "main", "rm", "/alive"); err != nil {
			t.Fatal(err)
		}
		p = k.waitPod("probed", "restarted after its liveness probe failed", time.Minute, func(p kubePod) bool {
			st := p.container("main")
			return st.RestartCount == 1 && st.State.Running != nil
		})
		if last := p.container("main").LastState.Terminated; last == nil {
			t.Errorf("no last state after the restart: %s", p.container("main").view())
		}
		if w := strings.Join(k.warnings("probed"), "\n"); !strings.Contains(w, "Liveness probe failed") {
			t.Errorf("warning events %q: want the liveness probe's failure", w)
		}
	})

	t.Run("restart-on-failure", func(t *testing.T) {
		k := k.with(t)
		c := container("main", criAppImage, "sh", "-c",
			`if [ -e /data/ran ]; then echo second run; exec sleep 100000; fi; touch /data/ran; echo first run; exit 3`)
		c["volumeMounts"] = []any{map[string]any{"name": "data", "mountPath": "/data"}}
		pod := k.branchPod("flaky", nil, "OnFailure", c)
		pod["spec"].(map[string]any)["volumes"] = []any{map[string]any{"name": "data", "emptyDir": map[string]any{}}}
		k.apply(pod)
		p := k.waitPod("flaky", "restarted once and running", 2*time.Minute, func(p kubePod) bool {
			st := p.container("main")
			return st.RestartCount == 1 && st.State.Running != nil
		})
		if last := p.container("main").LastState.Terminated; last == nil || last.ExitCode != 3 {
			t.Errorf("last state %+v; want the first run's exit 3", last)
		}
		k.waitLogs("flaky", "main", "second run")
		if prev := k.kubectl("logs", "flaky", "-c", "main", "--previous"); !strings.Contains(prev, "first run") {
			t.Errorf("previous logs %q", prev)
		}
		k.checkOnBranch(p.container("main").id())
	})

	t.Run("delete-recreate", func(t *testing.T) {
		k := k.with(t)
		k.apply(k.branchPod("again", nil, "", container("main", criAppImage, "sh", "-c", watchScript)))
		first := k.waitRunning("again")
		pid := k.pidOf("inspect", first.container("main").id())
		if _, err := k.exec("again", "main", "sh", "-c", "echo old > /old"); err != nil {
			t.Fatal(err)
		}
		k.kubectl("delete", "pod", "again", "--wait=true", "--timeout=120s")
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("the deleted pod's process %d still runs", pid)
		}
		k.apply(k.branchPod("again", nil, "", container("main", criAppImage, "sh", "-c", watchScript)))
		second := k.waitRunning("again")
		if second.Metadata.UID == first.Metadata.UID || second.container("main").id() == first.container("main").id() {
			t.Fatalf("the recreated pod is the old one: %s %s", second.Metadata.UID, second.container("main").id())
		}
		if out, err := k.exec("again", "main", "cat", "/old"); err == nil {
			t.Errorf("the recreated pod has the old pod's file: %q", out)
		}
		k.forkCommitFromHost("again", "main", "recreated")
	})

	t.Run("self-fork", func(t *testing.T) {
		k := k.with(t)
		script := `echo base > /f
branchctl self fork -n 1 -- sh -c 'echo forked > /f && branchctl self commit' > /dev/null || { echo fork failed; exit 1; }
while [ "$(cat /f)" != forked ]; do sleep 0.2; done
echo self-committed
exec sleep 100000`
		k.apply(k.branchPod("selfish", map[string]string{"io.branchbox.socket": "true"}, "", container("main", insockImage, "sh", "-c", script)))
		k.waitRunning("selfish")
		k.waitLogs("selfish", "main", "self-committed")
		st := k.pod("selfish").container("main")
		if st.RestartCount != 0 || st.State.Running == nil {
			t.Fatalf("the self-forking container: %s", st.view())
		}
		k.stays("selfish", "main", st.view(), "after its own commit")
		if out, err := k.exec("selfish", "main", "cat", "/f"); err != nil || strings.TrimSpace(out) != "forked" {
			t.Fatalf("/f after the self commit: %q %v", out, err)
		}
		if out, err := k.exec("selfish", "main", "branchctl", "self", "tree"); err != nil {
			t.Fatalf("branchctl self tree in the pod: %v %s", err, out)
		}
	})

	t.Run("delete-with-branches", func(t *testing.T) {
		k := k.with(t)
		k.apply(k.branchPod("busy", nil, "", container("main", criAppImage, "sh", "-c", watchScript)))
		p := k.waitRunning("busy")
		kids := k.hostFork(p.container("main").id(), 3, "--", "sh", "-c", "exec sleep 100000")
		k.kubectl("delete", "pod", "busy", "--wait=true", "--timeout=120s")
		waitUntil(t, "the branches' processes to end", kubeWait(20*time.Second), func() bool {
			for _, kid := range kids {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", kid.InitPid)); err == nil {
					return false
				}
			}
			return true
		})
	})

	t.Run("host-users-false", func(t *testing.T) {
		// A pod with its own user namespace, as current clusters run
		// them (docs/userns.md): root inside is a mapped id outside,
		// and a fork from the host keeps the mapping, its commit seen.
		k := k.with(t)
		pod := k.branchPod("userns", nil, "", container("main", criAppImage, "sh", "-c", watchScript))
		pod["spec"].(map[string]any)["hostUsers"] = false
		k.apply(pod)
		k.waitRunning("userns")
		out, err := k.exec("userns", "main", "sh", "-c", "id -u; cat /proc/self/uid_map")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(out)
		if len(f) != 4 || f[0] != "0" || f[1] != "0" || f[2] == "0" || f[3] != "65536" {
			t.Fatalf("pod with hostUsers: false: id and uid_map %q; want root inside mapped to a range of 65536 outside", out)
		}
		k.checkOnBranch(k.pod("userns").container("main").id())
		k.forkCommitFromHost("userns", "main", "mapped")
		if w := k.warnings("userns"); len(w) > 0 {
			t.Errorf("warning events for the pod: %v", w)
		}
	})

	// No pod that was not meant to restart did, and none was killed.
	for _, name := range []string{"again", "selfish"} {
		st := k.pod(name).container("main")
		if st.RestartCount != 0 || st.State.Running == nil {
			t.Errorf("pod %s at the end: %s", name, st.view())
		}
		if w := k.warnings(name); len(w) > 0 {
			t.Errorf("warning events for pod %s: %v", name, w)
		}
	}
	if out, err := k.env.Crictl(k.ctx, "pods", "--name", "busy", "-q", "--state", "ready"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("the deleted pod's sandbox still ready: %q %v", out, err)
	}
}

// TestKubeletEphemeralStorage: a pod's ephemeral-storage limit counts
// what its branches write. On a node whose CRI's default snapshotter is
// branch (gen-containerd-config --cri-default-branch: containerd's CRI
// reports a container's writable layer only for that one), a branch of a
// pod's container writes 32 MiB past its limit of 16 MiB: the kubelet's
// stats count them and it evicts the pod, as it evicts one whose
// container wrote them, and the branch ends with the pod. Before, the
// snapshotter's usage of the container's snapshot was its own upper alone:
// branches and checkpoints wrote without a bound the kubelet could see.
func TestKubeletEphemeralStorage(t *testing.T) {
	k := kubeNodeCRI(t, daemons.CRIConfig{DefaultBranch: true}, daemons.KubeConfig{})
	c := container("main", criAppImage, "sh", "-c", watchScript)
	c["resources"] = map[string]any{"limits": map[string]any{"ephemeral-storage": "16Mi"}}
	k.apply(k.branchPod("hoarder", nil, "Never", c))
	id := k.waitRunning("hoarder").container("main").id()
	kids := k.hostFork(id, 1)
	if out, err := k.hostBranchctl("exec", id+"/"+kids[0].ID, "--", "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=32"); err != nil {
		t.Fatalf("write 32 MiB in the branch: %v %s", err, out)
	}
	// What the kubelet reads first: the container's root filesystem in
	// its stats summary (the CRI's writable layer).
	var used uint64
	for deadline := time.Now().Add(kubeWait(time.Minute)); used < 32<<20; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			crictl, _ := k.env.Crictl(k.ctx, "stats", "-o", "json", id)
			t.Fatalf("the kubelet's stats have %d bytes in the container's root filesystem after its branch wrote 32 MiB; the CRI's: %s", used, crictl)
		}
		used = k.rootfsUsed("hoarder", "main")
	}
	p := k.waitPod("hoarder", "evicted for its branch's 32 MiB", kubeWait(2*time.Minute), func(p kubePod) bool {
		return p.Status.Phase == "Failed" && p.Status.Reason == "Evicted"
	})
	if !strings.Contains(p.Status.Message, "ephemeral") {
		t.Errorf("the eviction's message %q: want the ephemeral-storage limit", p.Status.Message)
	}
	waitUntil(t, "the branch's processes to end with the pod", kubeWait(20*time.Second), func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", kids[0].InitPid))
		return err != nil
	})
}

// with is the same cluster for a subtest: failures are the subtest's.
func (k *kubeTest) with(t *testing.T) *kubeTest {
	c := *k.criTest
	c.t = t
	return &kubeTest{criTest: &c, kube: k.kube, systemd: k.systemd}
}
