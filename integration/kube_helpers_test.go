//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/systemd"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// kubeTest is a single-node Kubernetes cluster (etcd, kube-apiserver and
// a kubelet, all of make binaries' pinned builds) on a criTest's private
// containerd, configured as docs/containerd-config.toml has it, with the
// RuntimeClass of docs/runtimeclass.yaml applied. Pods name the node (no
// scheduler) and mount no service-account token (no controller manager
// makes one). Pod networking is the CRI tests' own CNI plugin: each pod
// gets a network namespace of its own with an address nothing outside it
// reaches, so probes are exec probes.
type kubeTest struct {
	*criTest
	kube    *daemons.Kube
	systemd bool // the kubelet's cgroup driver is systemd's
}

// kubeNode starts the cluster: with the systemd cgroup driver (kubelet and
// both CRI handlers, as kubeadm nodes run) where systemd is the init, else
// the cgroupfs driver.
func kubeNode(t *testing.T) *kubeTest {
	t.Helper()
	return kubeNodeWith(t, daemons.KubeConfig{})
}

// kubeNodeWith is kubeNode with a kubelet configured by cfg (its driver,
// labels and timeout are kubeNode's own).
func kubeNodeWith(t *testing.T, cfg daemons.KubeConfig) *kubeTest {
	t.Helper()
	return kubeNodeCRI(t, daemons.CRIConfig{}, cfg)
}

// kubeNodeCRI is kubeNodeWith with the node's containerd configured by
// cri (its cgroup drivers are kubeNode's own).
func kubeNodeCRI(t *testing.T, cri daemons.CRIConfig, cfg daemons.KubeConfig) *kubeTest {
	t.Helper()
	useSystemd := systemdNode()
	// The node has a network namespace of its own (daemons.StartKube says
	// why), which its containerd and the pods' runtimes share.
	cri.SystemdCgroup, cri.RuncSystemdCgroup = useSystemd, useSystemd
	c := criEnvNet(t, cri, true)
	// The env's context ends 5 minutes after its start, which bounds a
	// daemon's start; a cluster's tests run longer (under emulation, much
	// longer): go test's -timeout bounds them.
	c.ctx = context.WithoutCancel(c.ctx)
	importCRIImage(t, c, insockImage, insockArchive(t))
	timeout := 2 * time.Minute
	if daemons.Emulated() {
		timeout = 15 * time.Minute
	}
	cfg.SystemdCgroup = useSystemd
	// What docs/runtimeclass.yaml's nodeSelector asks for.
	cfg.NodeLabels = []string{"branchbox.io/runtime=branch"}
	cfg.Timeout = timeout
	kube, err := c.env.StartKube(c.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeTest{criTest: c, kube: kube, systemd: useSystemd}
	// Runs before criEnv's cleanup (which removes what pods are left
	// and checks for leaks): the kubelet stops first, so it does not
	// restart what that removes.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log:\n%s", lastLines(c.env.Log("kubelet"), 60))
			t.Logf("kube-apiserver log:\n%s", lastLines(c.env.Log("kube-apiserver"), 20))
		}
		if err := kube.Stop(context.Background()); err != nil {
			t.Errorf("stop kubernetes: %v", err)
		}
		if out, err := c.env.Crictl(context.Background(), "rmp", "--all", "--force"); err != nil {
			t.Errorf("remove pods: %v\n%s", err, out)
		}
		if err := kube.RemoveCgroups(context.Background()); err != nil {
			t.Errorf("remove the kubelet's cgroups: %v", err)
		}
	})
	// The documented RuntimeClass, as a user applies it.
	if _, err := kube.Kubectl(c.ctx, "", "apply", "-f", filepath.Join("..", "docs", "runtimeclass.yaml")); err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount admission plugin wants the namespace's default
	// service account, which a controller manager would make.
	if _, err := kube.Kubectl(c.ctx, "", "create", "serviceaccount", "default"); err != nil {
		t.Fatal(err)
	}
	return k
}

// systemdNode says whether the node runs the systemd cgroup driver (the
// kubelet's and both CRI handlers'): where systemd is the init on a cgroup
// v2 only host, as the kubelet wants it (the cgroup v2 VM).
func systemdNode() bool {
	return systemd.IsRunningSystemd() && cgroups.IsCgroup2UnifiedMode()
}

// insockArchive writes the insock image (busybox with a static branchctl)
// as an archive and returns its path.
func insockArchive(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(daemons.BinDirFromEnv(), "branchctl"))
	if err != nil {
		t.Fatalf("branchctl not built (make binaries): %v", err)
	}
	archive := filepath.Join(t.TempDir(), "insock.tar")
	writeToolImage(t, archive, insockImage, "bin/branchctl", data)
	return archive
}

// importCRIImage imports an image archive into the CRI's namespace, as
// the pods' images are (the default snapshotter; the branch handler
// unpacks into its own), and waits until the CRI plugin sees it.
func importCRIImage(t *testing.T, c *criTest, ref, archive string) {
	t.Helper()
	if _, err := c.env.CtrIn(c.ctx, daemons.CRINamespace, "images", "import", "--snapshotter", "overlayfs", archive); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the CRI plugin to see "+ref, 10*time.Second, func() bool {
		_, err := c.env.Crictl(c.ctx, "inspecti", ref)
		return err == nil
	})
}

// kubectl runs kubectl and fails the test on error.
func (k *kubeTest) kubectl(args ...string) string {
	k.t.Helper()
	out, err := k.kube.Kubectl(k.ctx, "", args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// apply creates or updates an object given as a Go value.
func (k *kubeTest) apply(obj any) {
	k.t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.kube.Kubectl(k.ctx, string(b), "apply", "-f", "-"); err != nil {
		k.t.Fatal(err)
	}
}

// kubeContainer is a container of a pod spec, in the API's JSON.
type kubeContainer map[string]any

// container is a container of one of the test images, never pulled.
func container(name, image string, command ...string) kubeContainer {
	return kubeContainer{"name": name, "image": image, "imagePullPolicy": "Never", "command": command}
}

// branchPod is a pod on the branch RuntimeClass, bound to the node.
func (k *kubeTest) branchPod(name string, annotations map[string]string, restart string, containers ...kubeContainer) map[string]any {
	if restart == "" {
		restart = "Always"
	}
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": name, "annotations": annotations},
		"spec": map[string]any{
			"nodeName":                     k.kube.Node,
			"runtimeClassName":             "branch",
			"automountServiceAccountToken": false,
			"enableServiceLinks":           false,
			// The node has no cluster DNS (no DNS add-on): the kubelet
			// would warn and fall back to Default.
			"dnsPolicy":                     "Default",
			"restartPolicy":                 restart,
			"terminationGracePeriodSeconds": 2,
			"containers":                    containers,
		},
	}
}

// kubePod is the part of a pod's status the tests look at.
type kubePod struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		NodeSelector map[string]string `json:"nodeSelector"`
	} `json:"spec"`
	Status struct {
		Phase      string `json:"phase"`
		Reason     string `json:"reason"`
		Message    string `json:"message"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
		ContainerStatuses []kubeContainerStatus `json:"containerStatuses"`
	} `json:"status"`
}

type kubeContainerStatus struct {
	Name         string `json:"name"`
	Ready        bool   `json:"ready"`
	RestartCount int    `json:"restartCount"`
	ContainerID  string `json:"containerID"`
	State        struct {
		Running *struct {
			StartedAt string `json:"startedAt"`
		} `json:"running"`
		Waiting *struct {
			Reason string `json:"reason"`
		} `json:"waiting"`
		Terminated *kubeTerminated `json:"terminated"`
	} `json:"state"`
	LastState struct {
		Terminated *kubeTerminated `json:"terminated"`
	} `json:"lastState"`
}

type kubeTerminated struct {
	ExitCode int    `json:"exitCode"`
	Reason   string `json:"reason"`
}

// pod reads a pod through the API server.
func (k *kubeTest) pod(name string) kubePod {
	k.t.Helper()
	var p kubePod
	if err := json.Unmarshal([]byte(k.kubectl("get", "pod", name, "-o", "json")), &p); err != nil {
		k.t.Fatal(err)
	}
	return p
}

func (p kubePod) condition(typ string) string {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

func (p kubePod) container(name string) kubeContainerStatus {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == name {
			return c
		}
	}
	return kubeContainerStatus{}
}

// view is what the API server says of a container, as one line: what must
// not change while the container branches.
func (c kubeContainerStatus) view() string {
	started := ""
	if c.State.Running != nil {
		started = c.State.Running.StartedAt
	}
	return fmt.Sprintf("id=%s running=%v started=%s ready=%v restarts=%d waiting=%v terminated=%v last=%v",
		c.ContainerID, c.State.Running != nil, started, c.Ready, c.RestartCount, c.State.Waiting, c.State.Terminated, c.LastState.Terminated)
}

// id is the container's id in containerd (containerID is containerd://ID).
func (c kubeContainerStatus) id() string {
	_, id, _ := strings.Cut(c.ContainerID, "://")
	return id
}

// kubeWait is how long the tests wait for the kubelet to act: under
// emulation (the cgroup v2 VM) everything is 10-30 times slower.
func kubeWait(d time.Duration) time.Duration {
	if daemons.Emulated() {
		return 20 * d
	}
	return d
}

// waitPod waits until cond holds of the pod, and returns it.
func (k *kubeTest) waitPod(name, what string, timeout time.Duration, cond func(kubePod) bool) kubePod {
	k.t.Helper()
	var p kubePod
	waitUntil(k.t, "pod "+name+": "+what, kubeWait(timeout), func() bool {
		out, err := k.kube.Kubectl(k.ctx, "", "get", "pod", name, "-o", "json")
		if err != nil {
			return false
		}
		p = kubePod{}
		return json.Unmarshal([]byte(out), &p) == nil && cond(p)
	})
	return p
}

// waitRunning waits until the pod's containers all run and are ready.
func (k *kubeTest) waitRunning(name string) kubePod {
	k.t.Helper()
	return k.waitPod(name, "running and ready", time.Minute, func(p kubePod) bool {
		return p.Status.Phase == "Running" && p.condition("Ready") == "True"
	})
}

// exec runs a command in a pod's container through the API server and the
// kubelet (kubectl exec), and returns its output.
func (k *kubeTest) exec(pod, ctr string, args ...string) (string, error) {
	return k.kube.Kubectl(k.ctx, "", append([]string{"exec", pod, "-c", ctr, "--"}, args...)...)
}

// warnings lists the Warning events the API server holds for a pod
// (probe failures, back-offs, kills).
func (k *kubeTest) warnings(pod string) []string {
	k.t.Helper()
	out := k.kubectl("get", "events", "--field-selector", "involvedObject.name="+pod+",type=Warning", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
	var w []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" {
			w = append(w, l)
		}
	}
	return w
}

// hostBranchctl runs branchctl on the host against the cluster's
// containerd, in the CRI's namespace as docs/kubernetes.md shows it.
// hostFork forks n branches of container id with branchctl on the host
// (--json, then args: more flags, or "--" and a command) and returns them.
func (k *kubeTest) hostFork(id string, n int, args ...string) []client.BranchInfo {
	k.t.Helper()
	out, err := k.hostBranchctl(append([]string{"fork", id, "-n", strconv.Itoa(n), "--json"}, args...)...)
	var kids []client.BranchInfo
	if err == nil {
		err = json.Unmarshal([]byte(out), &kids)
	}
	if err != nil || len(kids) != n {
		k.t.Fatalf("fork --json: %v %q", err, out)
	}
	return kids
}

func (k *kubeTest) hostBranchctl(args ...string) (string, error) {
	cmd := exec.CommandContext(k.ctx, filepath.Join(k.env.BinDir, "branchctl"), append([]string{"--namespace", daemons.CRINamespace}, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERD_ADDRESS="+k.env.Address)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("branchctl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
