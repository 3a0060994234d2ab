//go:build linux

// Package daemons starts a private containerd, with the branch snapshotter
// as a proxy plugin, in a temporary directory, and takes it all down again:
// daemons, shims, mounts and files. Tests, benchmarks and the demo share it.
package daemons

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/containerdconfig"
)

// Env is a running private containerd with the branch snapshotter.
type Env struct {
	Dir                string // everything lives under here
	Namespace          string // containerd namespace, unique to this env
	BinDir             string
	Address            string // containerd's gRPC socket
	SnapshotterRoot    string
	SnapshotterAddress string
	ContainerdRoot     string
	ContainerdState    string
	// NetNS is the network namespace (a file under Dir) the env's daemons
	// run in, with Config.PrivateNetwork; "" for the host's.
	NetNS string

	containerd  *proc
	snapshotter *proc
	cri         *CRIConfig
	logLevel    string
	extraEnv    []string
	// snapshotterFlags are Config.SnapshotterFlags.
	snapshotterFlags []string
	// diskDir is Config.DiskDir.
	diskDir string
}

// Config says where the binaries are and where to put the state.
type Config struct {
	// BinDir holds containerd, ctr, containerd-shim-runc-v2 and
	// containerd-branch-snapshotter. Default: $BRANCHBOX_BIN.
	BinDir string
	// Dir is the state directory; a new temporary one if empty.
	Dir string
	// DiskDir, if set, holds what a node keeps on its disk, as under
	// /var/lib: containerd's root and the snapshotter's. The rest
	// (sockets, containerd's state, logs, FIFOs) stays in Dir, as a
	// node's /run. Default: Dir.
	DiskDir string
	// CRI, if set, runs containerd with its CRI plugins on (see cri.go);
	// otherwise they are off.
	CRI *CRIConfig
	// LogLevel of containerd, its shims and the snapshotter. Default:
	// debug, which tests want when they fail; benchmarks run at info, as
	// the daemons do by default, since debug lines on every call cost
	// hundreds of microseconds of a fork or commit.
	LogLevel string
	// ContainerdEnv is added to containerd's environment, which its shims
	// inherit (the shim's node-wide settings, BRANCHBOX_*).
	ContainerdEnv []string
	// SnapshotterFlags are given to every start of the snapshotter
	// (benchmarks compare its settings this way).
	SnapshotterFlags []string
	// PrivateNetwork runs the env's daemons (and so the shims and the
	// pods on the host's network) in a network namespace of its own, with
	// loopback and the address NodeIP; Stop removes it with the rest.
	PrivateNetwork bool
}

// Emulated reports whether the tests run in a VM without hardware
// virtualisation ($BRANCHBOX_TEST_EMULATED=1, set by hack/cgroupv2-vm.sh
// under TCG), 10-30 times slower than on the host: tests that move tens
// of megabytes to have time to interrupt something move less there.
func Emulated() bool {
	return os.Getenv("BRANCHBOX_TEST_EMULATED") == "1"
}

// BinDirFromEnv returns $BRANCHBOX_BIN, or bin/ at the module root found
// from the working directory.
func BinDirFromEnv() string {
	if d := os.Getenv("BRANCHBOX_BIN"); d != "" {
		return d
	}
	wd, _ := os.Getwd()
	for d := wd; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "bin")
		}
	}
	return filepath.Join(wd, "bin")
}

// Start brings up the snapshotter and containerd and waits until both answer.
func Start(ctx context.Context, cfg Config) (_ *Env, retErr error) {
	if cfg.BinDir == "" {
		cfg.BinDir = BinDirFromEnv()
	}
	bin, err := filepath.Abs(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	for _, b := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "containerd-branch-snapshotter"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: build it with `make binaries`: %w", b, bin, err)
		}
	}
	dir := cfg.Dir
	if dir == "" {
		// Short, so that socket paths stay well under the 108-byte limit.
		if dir, err = os.MkdirTemp("", "bbx-"); err != nil {
			return nil, err
		}
		// Searchable by all, as /run/containerd is on a node: root of a
		// user namespace (an unprivileged host uid) must reach the
		// bundles' root filesystems below it.
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	e := &Env{
		Dir:                dir,
		Namespace:          "bbx-" + filepath.Base(dir),
		BinDir:             bin,
		Address:            filepath.Join(dir, "containerd.sock"),
		SnapshotterRoot:    filepath.Join(dir, "snapshotter"),
		SnapshotterAddress: filepath.Join(dir, "snapshotter.sock"),
		ContainerdRoot:     filepath.Join(dir, "root"),
		ContainerdState:    filepath.Join(dir, "state"),
		diskDir:            cfg.DiskDir,
		cri:                cfg.CRI,
		logLevel:           cfg.LogLevel,
		extraEnv:           cfg.ContainerdEnv,
		snapshotterFlags:   cfg.SnapshotterFlags,
	}
	if e.logLevel == "" {
		e.logLevel = "debug"
	}
	if cfg.DiskDir != "" {
		e.SnapshotterRoot = filepath.Join(cfg.DiskDir, "snapshotter")
		e.ContainerdRoot = filepath.Join(cfg.DiskDir, "root")
	}
	defer func() {
		if retErr != nil {
			if err := e.Stop(context.WithoutCancel(ctx)); err != nil {
				log.G(ctx).WithError(err).Warn("cleanup after failed start")
			}
		}
	}()
	if cfg.PrivateNetwork {
		if err := e.makeNetNS(ctx); err != nil {
			return nil, err
		}
	}
	if err := e.StartSnapshotter(ctx); err != nil {
		return nil, err
	}
	if err := e.startContainerd(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// StartSnapshotter starts containerd-branch-snapshotter on the env's root and
// waits for its socket. extraEnv is added to its environment (tests arm
// fault points that way).
func (e *Env) StartSnapshotter(ctx context.Context, extraEnv ...string) error {
	return e.StartSnapshotterWith(ctx, nil, extraEnv...)
}

// StartSnapshotterWith is StartSnapshotter with extra daemon flags.
func (e *Env) StartSnapshotterWith(ctx context.Context, flags []string, extraEnv ...string) error {
	if e.snapshotter != nil {
		return errors.New("snapshotter already running")
	}
	args := append([]string{"--root", e.SnapshotterRoot, "--address", e.SnapshotterAddress, "--log-level", e.logLevel}, e.snapshotterFlags...)
	args = append(args, flags...)
	cmd, err := e.spawn("snapshotter", extraEnv, filepath.Join(e.BinDir, "containerd-branch-snapshotter"), args...)
	if err != nil {
		return err
	}
	e.snapshotter = cmd
	return e.waitSocket(ctx, cmd, "snapshotter", e.SnapshotterAddress)
}

// SnapshotterPid is the pid of the running snapshotter daemon.
func (e *Env) SnapshotterPid() int {
	if e.snapshotter == nil {
		return 0
	}
	return e.snapshotter.cmd.Process.Pid
}

// ContainerdPid is the pid of the running containerd daemon.
func (e *Env) ContainerdPid() int {
	if e.containerd == nil {
		return 0
	}
	return e.containerd.cmd.Process.Pid
}

// WaitSnapshotterExit waits for the snapshotter to exit by itself (a fault
// point killed it) and returns how it ended.
func (e *Env) WaitSnapshotterExit(timeout time.Duration) error {
	if e.snapshotter == nil {
		return errors.New("snapshotter not running")
	}
	select {
	case <-e.snapshotter.done:
		err := e.snapshotter.err
		e.snapshotter = nil
		return err
	case <-time.After(timeout):
		return fmt.Errorf("snapshotter still running after %s", timeout)
	}
}

// StopSnapshotter sends sig to the snapshotter and waits for it to exit.
func (e *Env) StopSnapshotter(sig syscall.Signal) error {
	if e.snapshotter == nil {
		return nil
	}
	err := e.snapshotter.stop(sig, 15*time.Second)
	e.snapshotter = nil
	return err
}

// StopContainerd stops containerd with sig (SIGKILL: a crash) and waits
// for it to exit; the shims outlive it, as on a node whose containerd is
// restarted or upgraded. StartContainerd starts it again.
func (e *Env) StopContainerd(sig syscall.Signal) error {
	if e.containerd == nil {
		return nil
	}
	err := e.containerd.stop(sig, 15*time.Second)
	e.containerd = nil
	if sig == syscall.SIGTERM || sig == syscall.SIGKILL {
		// Its exit status for either is the signal's, not a failure.
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil
		}
	}
	return err
}

// StartContainerd starts containerd with the env's configuration, after
// StopContainerd.
func (e *Env) StartContainerd(ctx context.Context) error {
	if e.containerd != nil {
		return errors.New("containerd already running")
	}
	return e.startContainerd(ctx)
}

func (e *Env) startContainerd(ctx context.Context) error {
	config := filepath.Join(e.Dir, "containerd.toml")
	text := ContainerdConfig(e.ContainerdRoot, e.ContainerdState, e.Address, e.SnapshotterAddress, e.SnapshotterRoot)
	if e.cri != nil {
		var err error
		if text, err = e.criContainerdConfig(); err != nil {
			return err
		}
	}
	if err := os.WriteFile(config, []byte(text), 0o600); err != nil {
		return err
	}
	cmd, err := e.spawn("containerd", e.extraEnv, filepath.Join(e.BinDir, "containerd"), "--config", config, "--log-level", e.logLevel)
	if err != nil {
		return err
	}
	e.containerd = cmd
	return e.waitSocket(ctx, cmd, "containerd", e.Address)
}

// ContainerdConfig returns the configuration of a private containerd with
// the branch snapshotter: the node configuration of the docs (the same
// generator), with private paths and the CRI plugins off.
func ContainerdConfig(root, state, address, snapshotterAddress, snapshotterRoot string) string {
	return containerdconfig.Render(containerdconfig.Options{
		SnapshotterAddress: snapshotterAddress,
		SnapshotterRoot:    snapshotterRoot,
		Root:               root,
		State:              state,
		Address:            address,
		DisabledPlugins:    containerdconfig.CRIPlugins(),
	})
}

// NodeIP is the address of a private network's interface (an end of a
// veth pair whose other end is in the same namespace: these VMs have no
// dummy device), for what must not be loopback (a kubelet's node IP).
const NodeIP = "10.254.0.1"

// makeNetNS makes the env's network namespace, kept by a bind mount of it
// on a file under Dir (which Stop unmounts), with lo and NodeIP up.
func (e *Env) makeNetNS(ctx context.Context) error {
	if err := os.MkdirAll(e.Dir, 0o700); err != nil {
		return err
	}
	ns := filepath.Join(e.Dir, "netns")
	if err := os.WriteFile(ns, nil, 0o600); err != nil {
		return err
	}
	script := "ip link set lo up && ip link add bbx0 type veth peer name bbx1 && ip addr add " + NodeIP + "/24 dev bbx0 && ip link set bbx1 up && ip link set bbx0 up"
	out, err := exec.CommandContext(ctx, "unshare", "--net="+ns, "sh", "-c", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("make the env's network namespace: %w: %s", err, out)
	}
	e.NetNS = ns
	return nil
}

// Log returns the output of the named daemon ("containerd" or "snapshotter").
func (e *Env) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(e.Dir, name+".log"))
	return string(b)
}

// Ctr runs ctr against the env's containerd in the env's namespace and
// returns its standard output; a failure carries its standard error.
func (e *Env) Ctr(ctx context.Context, args ...string) (string, error) {
	return e.CtrIn(ctx, e.Namespace, args...)
}

// withFIFODir has a ctr command that makes a task's FIFOs (run, tasks
// start, tasks exec) make them in the env's directory, which goes with
// it: ctr makes them under /run/containerd/fifo, and leaves those of a
// task it detaches from.
func (e *Env) withFIFODir(args []string) []string {
	at := 0
	switch {
	case len(args) > 0 && args[0] == "run":
		at = 1
	case len(args) > 1 && (args[0] == "tasks" || args[0] == "task" || args[0] == "t") && (args[1] == "start" || args[1] == "exec"):
		at = 2
	default:
		return args
	}
	out := append([]string(nil), args[:at]...)
	out = append(out, "--fifo-dir", filepath.Join(e.Dir, "fifo"))
	return append(out, args[at:]...)
}

// Stop takes everything down: containerd, then every shim it started (they
// outlive containerd by design), the snapshotter, every mount under Dir, and
// Dir itself. It reports what it had to clean up by force.
func (e *Env) Stop(ctx context.Context) error {
	var errs []error
	if e.containerd != nil {
		if err := e.containerd.stop(syscall.SIGTERM, 15*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop containerd: %w", err))
		}
		e.containerd = nil
	}
	// Shims of this containerd carry its address on their command line;
	// they and their containers are ours, identified by pid. A killed shim
	// cannot remove its socket: that goes too.
	for _, pid := range e.ShimPids() {
		log.G(ctx).WithField("pid", pid).Warn("killing shim left by containerd")
		sockets := e.ShimSockets(pid)
		killTree(pid)
		for _, s := range sockets {
			_ = os.Remove(s)
		}
	}
	if err := e.StopSnapshotter(syscall.SIGTERM); err != nil {
		errs = append(errs, fmt.Errorf("stop snapshotter: %w", err))
	}
	// runc puts containers in /<namespace>/<id> and never removes the
	// namespace level; the namespace is this env's alone. Likewise the
	// runtimes' per-namespace state directories (removed only if empty:
	// anything inside would be a leak for the tests to report).
	if err := removeCgroups(e.Namespace); err != nil {
		errs = append(errs, err)
	}
	namespaces := []string{e.Namespace}
	if e.cri != nil {
		namespaces = append(namespaces, CRINamespace)
	}
	for _, root := range []string{"/run/containerd/branch", "/run/containerd/runc"} {
		for _, ns := range namespaces {
			_ = os.Remove(filepath.Join(root, ns))
		}
	}
	if e.Dir == "" || e.Dir == "/" {
		return errors.Join(append(errs, fmt.Errorf("refusing to clean up state directory %q", e.Dir))...)
	}
	errs = append(errs, e.unmountAll()...)
	for _, d := range e.ownDirs() {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// ownDirs are the directories the env made and removes: Dir, and with a
// DiskDir the roots in it (not DiskDir itself, which may be a mount of
// the caller's).
func (e *Env) ownDirs() []string {
	if e.diskDir == "" {
		return []string{e.Dir}
	}
	return []string{e.Dir, e.ContainerdRoot, e.SnapshotterRoot}
}

// unmountAll detaches every mount under the env's directories.
func (e *Env) unmountAll() []error {
	var errs []error
	for _, d := range e.ownDirs() {
		mounts, err := MountsUnder(d)
		if err != nil {
			errs = append(errs, err)
		}
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errs
}
