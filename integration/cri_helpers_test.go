//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// The CRI tests' images: a pause image (a static Go binary that reaps
// orphans, as the pod's PID 1 must when the pod shares a PID namespace)
// and the busybox test image as the app.
const (
	criPauseImage = "docker.io/branchbox/pause:test"
	criAppImage   = ociimage.ImageRef
)

// runcRoot is where containerd-shim-runc-v2 keeps runc's state.
const runcRoot = "/run/containerd/runc"

// criBranchType is the runtime type containerd records for the branch
// handler's pods and containers: runc-v2's, with runtime_path naming the
// branch shim (docs/cri.md); the shim process tells them apart.
const criBranchType = "io.containerd.runc.v2"

const pauseSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

// pause holds a pod's namespaces: it exits on SIGINT or SIGTERM and reaps
// every orphan re-parented to it.
func main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
`

// criPodIP is the address the test CNI plugin gives every pod.
const criPodIP = "10.88.0.2"

// cniPlugin is a CNI plugin for the tests (Debian's plugins all reach the
// host): it gives the pod's network namespace an eth0, up, with criPodIP,
// that is one end of a veth pair whose other end stays in the pod too
// (these VMs have no dummy device); it touches nothing of the host.
const cniPlugin = `#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
/bin/cat > /dev/null
case "$CNI_COMMAND" in
ADD)
	nsenter --net="$CNI_NETNS" ip link add "$CNI_IFNAME" type veth peer name bbx-peer &&
	nsenter --net="$CNI_NETNS" ip link set bbx-peer up &&
	nsenter --net="$CNI_NETNS" ip addr add ` + criPodIP + `/24 dev "$CNI_IFNAME" &&
	nsenter --net="$CNI_NETNS" ip link set "$CNI_IFNAME" up || exit 1
	printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","sandbox":"%s"}],"ips":[{"address":"` + criPodIP + `/24","interface":0}]}' "$CNI_IFNAME" "$CNI_NETNS"
	;;
VERSION)
	printf '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'
	;;
esac
`

// criTest is a private containerd with its CRI plugin on, the branch
// runtime handler configured as docs/containerd-config.toml has it, and
// the test images imported into the CRI namespace.
type criTest struct {
	t      *testing.T
	ctx    context.Context
	env    *daemons.Env
	client *containerd.Client
	dir    string   // pod and container configs, pod logs
	ids    []string // every pod and container id made, for the cleanup check
}

// criEnv starts the env and registers a cleanup, run before the env's own
// teardown, that force-removes every pod, kills by pid whatever a runtime
// bug left in the env's cgroups, and checks that no runtime state is left.
func criEnv(t *testing.T) *criTest {
	t.Helper()
	return criEnvWith(t, daemons.CRIConfig{})
}

// criEnvWith is criEnv with the CRI settings of cfg (its image and CNI
// fields are the test's own).
func criEnvWith(t *testing.T, cfg daemons.CRIConfig) *criTest {
	t.Helper()
	return criEnvNet(t, cfg, false)
}

// criEnvNet is criEnvWith, with the env's daemons in a network namespace
// of their own when privateNet is set (daemons.Config.PrivateNetwork).
func criEnvNet(t *testing.T, cfg daemons.CRIConfig, privateNet bool) *criTest {
	t.Helper()
	requireRoot(t)
	for _, b := range []string{"crictl", "containerd-shim-branch-v1"} {
		if _, err := os.Stat(filepath.Join(daemons.BinDirFromEnv(), b)); err != nil {
			t.Fatalf("%s not built (make binaries): %v", b, err)
		}
	}
	dir := t.TempDir()
	pauseArchive, appArchive := filepath.Join(dir, "pause.tar"), filepath.Join(dir, "app.tar")
	writePauseImage(t, pauseArchive)
	if err := ociimage.WriteBusyboxImageFile(appArchive); err != nil {
		t.Fatal(err)
	}
	cniConf, cniBin := filepath.Join(dir, "cni", "net.d"), filepath.Join(dir, "cni", "bin")
	for _, d := range []string{cniConf, cniBin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(cniBin, "bbx-dummy"), []byte(cniPlugin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cniConf, "10-bbx.conflist"), []byte(`{"cniVersion":"1.0.0","name":"bbx","plugins":[{"type":"bbx-dummy"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.SandboxImage, cfg.CNIConfDir, cfg.CNIBinDir = criPauseImage, cniConf, cniBin
	ctx, env := startEnvWith(t, daemons.Config{CRI: &cfg, PrivateNetwork: privateNet})
	client, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	c := &criTest{t: t, ctx: ctx, env: env, client: client, dir: dir}
	t.Cleanup(func() {
		if out, err := env.Crictl(context.Background(), "rmp", "--all", "--force"); err != nil {
			t.Errorf("remove pods: %v\n%s", err, out)
		}
		// Not waitUntil: a cleanup must go on to the checks below.
		for deadline := time.Now().Add(15 * time.Second); len(c.shims()) != 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("shims still running after the pods were removed: %v", c.shims())
				break
			}
		}
		client.Close()
		killLeftovers(t, env.Namespace)
		for _, id := range c.ids {
			for _, root := range []string{runtimeRoot, runcRoot} {
				// The container's and its branches' (<id>.b<n>).
				states, _ := filepath.Glob(filepath.Join(root, daemons.CRINamespace, id+"*"))
				for _, state := range states {
					t.Errorf("runtime state %s left", state)
					_ = os.RemoveAll(state)
				}
			}
		}
	})
	// As a kubelet's pulls would, the images land in the default
	// snapshotter (overlayfs) only: the branch handler must unpack them
	// into its own snapshotter on use.
	for _, a := range []string{pauseArchive, appArchive} {
		if _, err := env.CtrIn(ctx, daemons.CRINamespace, "images", "import", "--snapshotter", "overlayfs", a); err != nil {
			t.Fatal(err)
		}
	}
	// The CRI plugin learns of imported images from containerd's events.
	for _, ref := range []string{criPauseImage, criAppImage} {
		waitUntil(t, "the CRI plugin to see "+ref, 10*time.Second, func() bool {
			_, err := env.Crictl(ctx, "inspecti", ref)
			return err == nil
		})
	}
	return c
}

// writePauseImage builds the pause binary (static, so the image needs no
// libc) and writes an image archive holding it as /pause, its entrypoint.
func writePauseImage(t *testing.T, archive string) {
	t.Helper()
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "main.go"), filepath.Join(dir, "pause")
	if err := os.WriteFile(src, []byte(pauseSource), 0o644); err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command builds the pause image: %v", err)
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	layer, err := ociimage.FileLayer("pause", 0o755, data)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ociimage.WriteImage(f, criPauseImage, ocispec.ImageConfig{Entrypoint: []string{"/pause"}}, layer); err != nil {
		t.Fatal(err)
	}
}

// Namespace modes of the CRI API (runtime.v1.NamespaceMode).
const (
	nsPod       = 0
	nsContainer = 1
	nsNode      = 2
)

// podNS says how a pod (and its containers, unless overridden) shares
// network, PID and IPC namespaces.
type podNS struct{ network, pid, ipc int }

func (n podNS) options() map[string]any {
	return map[string]any{"network": n.network, "pid": n.pid, "ipc": n.ipc}
}

// writeJSON writes v as a JSON file in the test's directory.
func (c *criTest) writeJSON(name string, v any) string {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// runPod runs a pod sandbox on the handler and returns its id and the path
// of its config (crictl create needs it again). The pod's cgroups go under
// the env's namespace level, which the harness removes.
func (c *criTest) runPod(name, handler string, ns podNS) (string, string) {
	c.t.Helper()
	cfg := c.writeJSON(name+"-pod.json", map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "default", "uid": name + "-uid", "attempt": 0},
		"log_directory": filepath.Join(c.dir, "logs", name),
		"linux": map[string]any{
			"cgroup_parent":    "/" + c.env.Namespace,
			"security_context": map[string]any{"namespace_options": ns.options()},
		},
	})
	out, err := c.env.Crictl(c.ctx, "runp", "--runtime", handler, cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	id := lastLine(out)
	c.ids = append(c.ids, id)
	return id, cfg
}

// createContainer creates a container in pod running args, logging to
// <name>.log in the pod's log directory, and returns its id.
func (c *criTest) createContainer(pod, podCfg, name string, ns podNS, args ...string) string {
	c.t.Helper()
	return c.createFrom(pod, podCfg, name, map[string]any{
		"metadata": map[string]any{"name": name, "attempt": 0},
		"image":    map[string]any{"image": criAppImage},
		"command":  args,
		"log_path": name + ".log",
		"linux": map[string]any{
			"security_context": map[string]any{"namespace_options": ns.options()},
		},
	})
}

// createFrom creates a container of config cfg in pod and returns its id.
func (c *criTest) createFrom(pod, podCfg, name string, cfg map[string]any) string {
	c.t.Helper()
	out, err := c.env.Crictl(c.ctx, "create", pod, c.writeJSON(name+"-container.json", cfg), podCfg)
	if err != nil {
		c.t.Fatal(err)
	}
	id := lastLine(out)
	c.ids = append(c.ids, id)
	return id
}

// startFrom creates and starts a container of config cfg in pod and
// returns its id.
func (c *criTest) startFrom(pod, podCfg, name string, cfg map[string]any) string {
	c.t.Helper()
	id := c.createFrom(pod, podCfg, name, cfg)
	if _, err := c.env.Crictl(c.ctx, "start", id); err != nil {
		c.t.Fatal(err)
	}
	return id
}

// inspect returns crictl inspect(p)'s JSON for id, decoded.
func (c *criTest) inspect(cmd, id string) map[string]any {
	c.t.Helper()
	out, err := c.env.Crictl(c.ctx, cmd, "-o", "json", id)
	if err != nil {
		c.t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		c.t.Fatalf("decode %s %s: %v\n%s", cmd, id, err, out)
	}
	return m
}

// field walks decoded JSON along keys.
func field(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// pidOf is the host pid crictl inspect(p) reports for id.
func (c *criTest) pidOf(cmd, id string) int {
	c.t.Helper()
	m := c.inspect(cmd, id)
	pid, ok := field(m, "info", "pid").(float64)
	if !ok || pid <= 0 {
		c.t.Fatalf("%s %s has no pid: %v", cmd, id, field(m, "info"))
	}
	return int(pid)
}

// containerInfo is containerd's record of a CRI pod or container.
func (c *criTest) containerInfo(id string) (string, string) {
	c.t.Helper()
	ctx := namespaces.WithNamespace(c.ctx, daemons.CRINamespace)
	ctr, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		c.t.Fatal(err)
	}
	info, err := ctr.Info(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return info.Runtime.Name, info.Snapshotter
}

// shims lists the running shim daemons of the env's containerd (not the
// short-lived `start` and `delete` invocations), by binary name.
func (c *criTest) shims() map[int]string {
	out := map[int]string{}
	for _, pid := range c.env.ShimPids() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if last := args[len(args)-1]; last == "start" || last == "delete" {
			continue
		}
		out[pid] = filepath.Base(args[0])
	}
	return out
}

// ppid is the parent of pid, from /proc.
func ppid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	var state string
	var parent int
	if _, err := fmt.Sscan(s[i+1:], &state, &parent); err != nil {
		return 0, err
	}
	return parent, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// criFeatures is what `crictl info` reports of a runtime handler's
// features.
type criFeatures struct {
	RecursiveReadOnlyMounts bool `json:"recursive_read_only_mounts"`
	UserNamespaces          bool `json:"user_namespaces"`
}

// handlerFeatures is each runtime handler's features by name, and the
// `crictl info` output they were read from.
func (c *criTest) handlerFeatures() (map[string]criFeatures, string) {
	c.t.Helper()
	out, err := c.env.Crictl(c.ctx, "info", "-o", "json")
	if err != nil {
		c.t.Fatal(err)
	}
	var info struct {
		RuntimeHandlers []struct {
			Name     string      `json:"name"`
			Features criFeatures `json:"features"`
		} `json:"runtimeHandlers"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		c.t.Fatalf("decode crictl info: %v\n%s", err, out)
	}
	feats := map[string]criFeatures{}
	for _, h := range info.RuntimeHandlers {
		feats[h.Name] = h.Features
	}
	return feats, out
}

// assertGone fails the test for whatever of the pod or containers ids is
// left on the node: cgroups on any hierarchy, runtime state (the
// branches' too), mounts or bundles.
func (c *criTest) assertGone(ids []string) {
	t := c.t
	t.Helper()
	for _, id := range ids {
		if dirs := containerCgroupDirs(c.env.Namespace, id); len(dirs) != 0 {
			t.Errorf("cgroups of %s left: %v", id, dirs)
		}
		left, _ := filepath.Glob(filepath.Join(runtimeRoot, daemons.CRINamespace, id+"*"))
		for _, s := range left {
			t.Errorf("runtime state %s left", s)
		}
		bundle := filepath.Join(c.env.ContainerdState, "io.containerd.runtime.v2.task", daemons.CRINamespace, id)
		if m, _ := daemons.MountsUnder(bundle); len(m) != 0 {
			t.Errorf("mounts of %s left: %v", id, m)
		}
		if _, err := os.Stat(bundle); err == nil {
			t.Errorf("bundle of %s left", id)
		}
	}
}
