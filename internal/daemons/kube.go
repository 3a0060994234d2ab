//go:build linux

package daemons

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// KubeConfig says how to run the single-node cluster of StartKube.
type KubeConfig struct {
	// SystemdCgroup runs the kubelet with cgroupDriver: systemd (the
	// containerd must run its handlers with SystemdCgroup = true:
	// CRIConfig.SystemdCgroup and RuncSystemdCgroup); otherwise cgroupfs,
	// with the kubelet's cgroups under the env's namespace level.
	SystemdCgroup bool
	// NodeLabels are the node's labels, key=value.
	NodeLabels []string
	// Timeout bounds each daemon's start (default 2 minutes).
	Timeout time.Duration
	// CPUManagerStatic runs the kubelet's CPU manager with its static
	// policy, CPU 0 reserved and a reconcile every second: a Guaranteed
	// container with whole CPUs gets them alone, and the kubelet narrows
	// every other container's cpuset to the rest (UpdateContainerResources).
	CPUManagerStatic bool
}

// Kube is a single-node Kubernetes cluster on an env's containerd: etcd,
// kube-apiserver and a kubelet (no scheduler or controller manager: pods
// name their node). Everything lives under Dir, inside the env's.
type Kube struct {
	Dir        string
	Kubeconfig string
	Node       string
	Server     string

	env        *Env
	token      string
	systemd    bool
	cgroupRoot string // cgroupfs driver only: the kubelet's --cgroup-root
	etcd       *proc
	apiserver  *proc
	kubelet    *proc
}

// The sysctls the kubelet sets on start when they differ (its container
// manager's setupKernelTunables): it is given these values in its own mount
// namespace instead, so that a test does not change the host's kernel.panic
// or panic_on_oops under everything else the machine runs.
var kubeletSysctls = [][2]string{
	{"vm/overcommit_memory", "1"},
	{"vm/panic_on_oom", "0"},
	{"kernel/panic", "10"},
	{"kernel/panic_on_oops", "1"},
	{"kernel/keys/root_maxkeys", "1000000"},
	{"kernel/keys/root_maxbytes", "25000000"},
}

// kubeletWrapper runs the kubelet in a mount namespace of its own (unshare
// --mount, private): there the sysctl files above read as the kubelet
// wants them, and tmpfs hides the host's /var/lib and /var/log, where it
// keeps what its flags cannot move (device-plugins/kubelet.sock, the
// /var/log/containers links). The mount of its root directory on itself
// (rshared) goes with the namespace too. The namespace copies the host's
// mounts as they are when it starts, and where the host's mounts are
// private (no systemd as PID 1) an unmount on the host does not reach the
// copy: the overlay mounts there (other tests' sandboxes and branches)
// are let go at once, or the kubelet would hold their layers, and the
// space of aborted ones, for as long as it runs. $1 is the directory of
// the sysctl values; the rest is the kubelet's command line.
const kubeletWrapper = `set -e
d=$1; shift
umount -a -l -t overlay 2>/dev/null || true
for f in "$d"/*; do
	mount --bind "$f" "/proc/sys/$(basename "$f" | tr . /)"
done
mount -t tmpfs -o mode=0755 bbx-kubelet /var/lib
mkdir /var/lib/kubelet
mount -t tmpfs -o mode=0755 bbx-kubelet /var/log
exec "$@"
`

// StartKube starts etcd, kube-apiserver and a kubelet on the env's
// containerd, whose CRI plugin must be on, and waits for the node to be
// Ready. Binaries come from the env's BinDir (make binaries builds them).
func (e *Env) StartKube(ctx context.Context, cfg KubeConfig) (_ *Kube, retErr error) {
	if e.cri == nil {
		return nil, fmt.Errorf("start kubernetes: the env's containerd runs without its CRI plugin: %w", errdefs.ErrFailedPrecondition)
	}
	// The node's network namespace is the env's own: the kubelet wants a
	// node address that is not loopback, sets up iptables chains of its
	// own, and serves anonymous requests (see the kubelet's config), none
	// of which should touch the host's network; and it reaches
	// containerd's streaming server (exec, logs -f) on loopback, so both
	// share it.
	if e.NetNS == "" {
		return nil, fmt.Errorf("start kubernetes: the env has no network namespace of its own (Config.PrivateNetwork): %w", errdefs.ErrFailedPrecondition)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kubelet", "kubectl"} {
		if _, err := os.Stat(filepath.Join(e.BinDir, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: build it with `make binaries`: %w", b, e.BinDir, err)
		}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	k := &Kube{
		Dir:     filepath.Join(e.Dir, "kube"),
		Node:    "bbx-node-" + strings.TrimPrefix(e.Namespace, "bbx-"),
		env:     e,
		systemd: cfg.SystemdCgroup,
	}
	k.Node = strings.ToLower(k.Node)
	k.Kubeconfig = filepath.Join(k.Dir, "kubeconfig")
	if err := os.MkdirAll(k.Dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			if err := k.Stop(context.WithoutCancel(ctx)); err != nil {
				log.G(ctx).WithError(err).Warn("stop kubernetes after a failed start")
			}
			// No pod ran yet: the kubelet's QoS cgroups can go at once.
			if err := k.RemoveCgroups(context.WithoutCancel(ctx)); err != nil {
				log.G(ctx).WithError(err).Warn("remove the kubelet's cgroups after a failed start")
			}
		}
	}()
	// The usual ports: the node's network namespace is its own.
	const etcdClient, etcdPeer, apiPort, kubeletPort, healthzPort = 2379, 2380, 6443, 10250, 10248
	k.Server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	k.token = hex.EncodeToString(tok)

	// etcd. --unsafe-no-fsync: the data is thrown away with the test, and
	// fsyncs on a disk shared with other tests only slow it down.
	var err error
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	if k.etcd, err = e.spawn("etcd", nil, filepath.Join(e.BinDir, "etcd"),
		"--name", "bbx", "--data-dir", filepath.Join(k.Dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "bbx="+peerURL, "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return nil, err
	}
	// (The apiserver's readiness below includes etcd's.)

	// kube-apiserver: a static token for the test and the kubelet (the
	// group system:masters), every request allowed, a service-account key
	// it requires even though no pod here mounts a token.
	saKey := filepath.Join(k.Dir, "sa.key")
	if err := writeECKey(saKey); err != nil {
		return nil, err
	}
	tokens := filepath.Join(k.Dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(k.token+`,bbx-admin,bbx-admin,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, err
	}
	if k.apiserver, err = e.spawn("kube-apiserver", nil, filepath.Join(e.BinDir, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", NodeIP,
		"--secure-port", strconv.Itoa(apiPort),
		"--cert-dir", filepath.Join(k.Dir, "apiserver-pki"),
		"--token-auth-file", tokens,
		"--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--kubelet-preferred-address-types", "InternalIP",
		"--enable-priority-and-fairness=false",
		"--profiling=false"); err != nil {
		return nil, err
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: bbx
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: bbx-admin
  user:
    token: %s
contexts:
- name: bbx
  context:
    cluster: bbx
    user: bbx-admin
    namespace: default
current-context: bbx
`, k.Server, k.token)
	if err := os.WriteFile(k.Kubeconfig, []byte(kubeconfig), 0o600); err != nil {
		return nil, err
	}
	if err := k.waitReady(ctx, cfg.Timeout); err != nil {
		return nil, err
	}

	// The kubelet.
	if err := k.startKubelet(ctx, cfg, kubeletPort, healthzPort); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(cfg.Timeout)
	for {
		out, err := k.Kubectl(ctx, "", "get", "node", k.Node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && strings.TrimSpace(out) == "True" {
			return k, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("node %s not Ready within %s (%v %s):\n%s", k.Node, cfg.Timeout, err, out, tail(e.Log("kubelet"), 30))
		}
		select {
		case <-k.kubelet.done:
			return nil, fmt.Errorf("kubelet exited (%v):\n%s", k.kubelet.err, tail(e.Log("kubelet"), 30))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (k *Kube) startKubelet(ctx context.Context, cfg KubeConfig, port, healthzPort int) error {
	e := k.env
	root := filepath.Join(k.Dir, "kubelet")
	sysctls := filepath.Join(k.Dir, "sysctl")
	for _, d := range []string{root, sysctls, filepath.Join(k.Dir, "pod-logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	for _, s := range kubeletSysctls {
		if err := os.WriteFile(filepath.Join(sysctls, strings.ReplaceAll(s[0], "/", ".")), []byte(s[1]+"\n"), 0o644); err != nil {
			return err
		}
	}
	driver, cgroupRoot := "cgroupfs", ""
	if k.systemd {
		// The kubelet's own kubepods.slice under the root slice, as on a
		// kubeadm node; Stop stops it.
		driver = "systemd"
	} else {
		// Under the env's namespace level, which the env removes; the
		// kubelet wants its cgroup root to exist on every hierarchy.
		cgroupRoot = "/" + e.Namespace
		if err := makeCgroupRoot(e.Namespace); err != nil {
			return err
		}
		k.cgroupRoot = cgroupRoot
	}
	endpoint := "unix://" + e.Address
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: %q
imageServiceEndpoint: %q
cgroupDriver: %s
cgroupRoot: %q
failCgroupV1: false
failSwapOn: false
port: %d
healthzPort: %d
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
address: %s
podLogsDir: %q
resolvConf: ""
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
syncFrequency: 10s
shutdownGracePeriod: 0s
`, endpoint, endpoint, driver, cgroupRoot, port, healthzPort, NodeIP, filepath.Join(k.Dir, "pod-logs"))
	if cfg.CPUManagerStatic {
		config += "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerReconcilePeriod: 1s\n"
	}
	configPath := filepath.Join(k.Dir, "kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		return err
	}
	kubeconfig := filepath.Join(k.Dir, "kubelet.kubeconfig")
	if err := copyFile(k.Kubeconfig, kubeconfig); err != nil {
		return err
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("the kubelet runs in its own mount namespace through unshare (util-linux): %w", err)
	}
	args := []string{"--mount", "--propagation", "private", "sh", "-c", kubeletWrapper, "kubelet", sysctls,
		filepath.Join(e.BinDir, "kubelet"),
		"--config", configPath,
		"--kubeconfig", kubeconfig,
		"--root-dir", root,
		"--cert-dir", filepath.Join(root, "pki"),
		"--hostname-override", k.Node,
		"--node-ip", NodeIP,
		"--v", "2",
	}
	if len(cfg.NodeLabels) > 0 {
		args = append(args, "--node-labels", strings.Join(cfg.NodeLabels, ","))
	}
	if k.kubelet, err = e.spawn("kubelet", nil, unshare, args...); err != nil {
		return err
	}
	return nil
}

// Kubectl runs kubectl against the cluster with stdin and returns its
// standard output; a failure carries its standard error.
func (k *Kube) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	// In the node's network namespace, where the apiserver listens.
	full := append([]string{"--net=" + k.env.NetNS, "--", filepath.Join(k.env.BinDir, "kubectl"), "--kubeconfig", k.Kubeconfig}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// KubeletPid is the kubelet's pid, 0 once stopped.
func (k *Kube) KubeletPid() int {
	if k.kubelet == nil {
		return 0
	}
	return k.kubelet.cmd.Process.Pid
}

// Stop ends the kubelet, kube-apiserver and etcd, by pid, in that order.
// The pods stay: the kubelet leaves them to the runtime, as on a node.
func (k *Kube) Stop(ctx context.Context) error {
	var errs []error
	for _, d := range []struct {
		name string
		p    **proc
	}{{"kubelet", &k.kubelet}, {"kube-apiserver", &k.apiserver}, {"etcd", &k.etcd}} {
		if *d.p == nil {
			continue
		}
		if err := (*d.p).stop(syscall.SIGTERM, 30*time.Second); err != nil && !isTermExit(err) {
			errs = append(errs, fmt.Errorf("stop %s: %w", d.name, err))
		}
		*d.p = nil
	}
	return errors.Join(errs...)
}

// RemoveCgroups removes the kubelet's QoS cgroups once its pods are gone:
// kubepods below its cgroup root (cgroupfs), or its kubepods.slice, which
// systemd removes with the slices below it (systemd).
func (k *Kube) RemoveCgroups(ctx context.Context) error {
	if k.systemd {
		out, err := exec.CommandContext(ctx, "systemctl", "stop", "kubepods.slice").CombinedOutput()
		if err != nil {
			return fmt.Errorf("stop kubepods.slice: %w: %s", err, out)
		}
		return nil
	}
	if k.cgroupRoot == "" {
		return nil
	}
	var errs []error
	for _, top := range cgroupDirs(strings.TrimPrefix(k.cgroupRoot, "/")) {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(top, "kubepods"), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove kubelet cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// isTermExit says whether a daemon's exit error is its death by SIGTERM
// (etcd and the apiserver exit 0; the kubelet may die of the signal).
func isTermExit(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return true
		}
	}
	return false
}

// waitReady waits until the apiserver is ready (its /readyz, which
// includes etcd's health), asked from the node's network namespace.
func (k *Kube) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if _, last = k.Kubectl(ctx, "", "get", "--raw", "/readyz"); last == nil {
			return nil
		}
		for _, d := range []struct {
			name string
			p    *proc
		}{{"etcd", k.etcd}, {"kube-apiserver", k.apiserver}} {
			select {
			case <-d.p.done:
				return fmt.Errorf("%s exited (%v):\n%s", d.name, d.p.err, tail(k.env.Log(d.name), 30))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready within %s (%v):\n%s", timeout, last, tail(k.env.Log("kube-apiserver"), 30))
}

// makeCgroupRoot makes /<name> on every mounted cgroup hierarchy.
func makeCgroupRoot(name string) error {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		if err := os.Mkdir(filepath.Join("/sys/fs/cgroup", name), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make the kubelet's cgroup root: %w", err)
		}
		return nil
	}
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		fi, err := os.Lstat(h)
		// Symlinks (cpu -> cpu,cpuacct) name a hierarchy twice.
		if err != nil || !fi.IsDir() {
			continue
		}
		if err := os.Mkdir(filepath.Join(h, name), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make the kubelet's cgroup root in %s: %w", h, err)
		}
	}
	return nil
}

func writeECKey(path string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}
