//go:build linux

package daemons

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/containerdconfig"
)

// CRINamespace is the containerd namespace the CRI plugin keeps its pods,
// containers and images in.
const CRINamespace = "k8s.io"

// CRIConfig turns on containerd's CRI plugins, configured by
// hack/containerdconfig (the configuration docs/ gives), with private paths.
type CRIConfig struct {
	// SandboxImage is the pause image; the test imports it into
	// CRINamespace before running a pod, as no registry is reachable.
	SandboxImage string
	// CNIConfDir and CNIBinDir default to empty directories under the
	// env: no pod network, so pods can only use the host's.
	CNIConfDir, CNIBinDir string
	// SystemdCgroup renders the branch handler's runc option SystemdCgroup
	// = true (the node default of the docs); the tests' default is the
	// cgroupfs driver, as this host has no systemd.
	SystemdCgroup bool
	// RuncBinary is the runc the runc handler runs; the PATH's if empty.
	RuncBinary string
	// RuncSystemdCgroup does the same for the default runc handler, whose
	// driver the CRI reports to a kubelet (a kubeadm-style node sets both).
	RuncSystemdCgroup bool
	// RegistryConfigPath is the CRI's registry hosts directory (critest's
	// images come from a loopback registry that mirrors their registries).
	RegistryConfigPath string
	// DefaultBranch makes branch the CRI's default snapshotter
	// (containerdconfig.Options.CRIDefaultBranch).
	DefaultBranch bool
}

func (e *Env) criContainerdConfig() (string, error) {
	c := *e.cri
	if c.CNIConfDir == "" {
		c.CNIConfDir = filepath.Join(e.Dir, "cni", "net.d")
	}
	if c.CNIBinDir == "" {
		c.CNIBinDir = filepath.Join(e.Dir, "cni", "bin")
	}
	for _, d := range []string{c.CNIConfDir, c.CNIBinDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", fmt.Errorf("make CNI directory for the CRI plugin: %w", err)
		}
	}
	return containerdconfig.Render(containerdconfig.Options{
		SnapshotterAddress: e.SnapshotterAddress,
		SnapshotterRoot:    e.SnapshotterRoot,
		ShimPath:           filepath.Join(e.BinDir, "containerd-shim-branch-v1"),
		CgroupfsDriver:     !c.SystemdCgroup,
		RuncSystemdCgroup:  c.RuncSystemdCgroup,
		RegistryConfigPath: c.RegistryConfigPath,
		CRIDefaultBranch:   c.DefaultBranch,
		Root:               e.ContainerdRoot,
		State:              e.ContainerdState,
		Address:            e.Address,
		// NRI listens on a fixed host path that private daemons would share.
		DisabledPlugins: []string{"io.containerd.nri.v1.nri"},
		SandboxImage:    c.SandboxImage,
		CNIConfDir:      c.CNIConfDir,
		CNIBinDir:       c.CNIBinDir,
		// Tests bring their own CNI plugins; loopback needs none.
		CNIInternalLoopback: true,
		// Keeps pod network namespaces under the env, which Stop removes.
		NetNSUnderState: true,
		// Root on these VMs lacks CAP_SYS_RESOURCE, so no runtime can
		// lower a process's oom_score_adj below containerd's.
		RestrictOOMScoreAdj: !hasCapSysResource(),
		RuncBinary:          c.RuncBinary,
	}), nil
}

// Crictl runs crictl (from the env's bin directory) against the env's CRI
// endpoint and returns its standard output; a failure carries its standard
// error.
func (e *Env) Crictl(ctx context.Context, args ...string) (string, error) {
	stdout, stderr, err := e.CrictlIn(ctx, "", args...)
	if err != nil {
		return stdout, fmt.Errorf("crictl %s: %w\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout, nil
}

// CrictlIn runs crictl with stdin and returns both outputs.
func (e *Env) CrictlIn(ctx context.Context, stdin string, args ...string) (string, string, error) {
	endpoint := "unix://" + e.Address
	// An empty config file keeps the host's /etc/crictl.yaml out of it.
	cfg := filepath.Join(e.Dir, "crictl.yaml")
	if _, err := os.Stat(cfg); err != nil {
		if err := os.WriteFile(cfg, nil, 0o600); err != nil {
			return "", "", err
		}
	}
	full := append([]string{"--config", cfg, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "60s"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(e.BinDir, "crictl"), full...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// CtrIn runs ctr against the env's containerd in the given namespace.
func (e *Env) CtrIn(ctx context.Context, namespace string, args ...string) (string, error) {
	full := append([]string{"--address", e.Address, "--namespace", namespace}, e.withFIFODir(args)...)
	cmd := exec.CommandContext(ctx, filepath.Join(e.BinDir, "ctr"), full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ctr -n %s %s: %w\n%s%s", namespace, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// hasCapSysResource says whether this process may lower oom_score_adj.
func hasCapSysResource() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}
