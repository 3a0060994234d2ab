//go:build linux

package ocirt

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runc/libcontainer/utils"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

func getContainer(c *cmdline) (*libcontainer.Container, error) {
	return libcontainer.Load(c.g.root, c.args[0])
}

// loadSpec reads config.json from the bundle (the working directory).
func loadSpec(path string) (*specs.Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("JSON specification file %s not found", path)
		}
		return nil, err
	}
	defer f.Close()
	var spec *specs.Spec
	if err := json.NewDecoder(f).Decode(&spec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if spec == nil {
		return nil, errors.New("config cannot be null")
	}
	return spec, validateProcessSpec(spec.Process)
}

// create is runc create: a container whose init waits on the exec fifo
// until start.
func create(c *cmdline) error {
	container, spec, err := bundleContainer(c)
	if err != nil {
		return err
	}
	r := &runner{
		container:     container,
		shouldDestroy: true,
		consoleSocket: c.str("console-socket"),
		pidFile:       c.str("pid-file"),
		preserveFDs:   atoi(c.str("preserve-fds")),
		init:          true,
		subreaper:     !c.bool("no-subreaper"),
	}
	return r.run(spec.Process)
}

// bundleContainer is newContainer of --bundle, the working directory made
// the bundle as runc makes it; adjust, if any, changes the spec first.
func bundleContainer(c *cmdline, adjust ...func(*specs.Spec) error) (*libcontainer.Container, *specs.Spec, error) {
	if b := c.str("bundle"); b != "" {
		if err := os.Chdir(b); err != nil {
			return nil, nil, fmt.Errorf("bundle %s: %w", b, err)
		}
	}
	return newContainer(c, adjust...)
}

// newContainer creates the libcontainer container of the bundle in the
// working directory (its state, not yet its processes).
func newContainer(c *cmdline, adjust ...func(*specs.Spec) error) (*libcontainer.Container, *specs.Spec, error) {
	spec, err := loadSpec("config.json")
	if err != nil {
		return nil, nil, err
	}
	for _, a := range adjust {
		if err := a(spec); err != nil {
			return nil, nil, err
		}
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return nil, nil, errors.New("root path must be set in config.json")
	}
	rootfs := spec.Root.Path
	if !filepath.IsAbs(rootfs) {
		rootfs, _ = filepath.Abs(rootfs)
	}
	if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() {
		return nil, nil, fmt.Errorf("rootfs %s is not a directory: %v", rootfs, err)
	}
	id := c.args[0]
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:       id,
		UseSystemdCgroup: c.g.systemd,
		NoPivotRoot:      c.bool("no-pivot"),
		NoNewKeyring:     c.bool("no-new-keyring"),
		Spec:             spec,
		RootlessEUID:     os.Geteuid() != 0,
		RootlessCgroups:  false,
	})
	if err != nil {
		return nil, nil, err
	}
	container, err := libcontainer.Create(c.g.root, id, config)
	if err != nil {
		return nil, nil, err
	}
	return container, spec, nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func start(c *cmdline) error {
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	status, err := container.Status()
	if err != nil {
		return err
	}
	switch status {
	case libcontainer.Created:
		return container.Exec()
	case libcontainer.Stopped:
		return errors.New("cannot start a container that has stopped")
	case libcontainer.Running:
		return errors.New("cannot start an already running container")
	default:
		return fmt.Errorf("cannot start a container in the %s state", status)
	}
}

// execProcess is runc exec --process FILE, detached (the only form the task
// service uses).
func execProcess(c *cmdline) error {
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	status, err := container.Status()
	if err != nil {
		return err
	}
	if status == libcontainer.Stopped {
		return errors.New("cannot exec in a stopped container")
	}
	if status == libcontainer.Paused && !c.bool("ignore-paused") {
		return errors.New("cannot exec in a paused container (use --ignore-paused to override)")
	}
	path := c.str("process")
	if path == "" {
		return errors.New("exec needs --process: this runtime takes the process spec as a file")
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	var p specs.Process
	err = json.NewDecoder(f).Decode(&p)
	f.Close()
	if err != nil {
		return fmt.Errorf("decode process spec %s: %w", path, err)
	}
	if err := validateProcessSpec(&p); err != nil {
		return err
	}
	r := &runner{
		container:     container,
		consoleSocket: c.str("console-socket"),
		pidFile:       c.str("pid-file"),
		preserveFDs:   atoi(c.str("preserve-fds")),
		subCgroup:     execCgroup(container),
	}
	return r.run(&p)
}

// OwnLeaf is the child cgroup, on cgroup v2, that the processes of a
// container with branch cgroups below its own live in (the shim moves them
// there before the first branch cgroup): the container's cgroup then gives
// its children domain controllers and cannot take a process itself.
const OwnLeaf = ".leaf"

// execCgroup is the sub-cgroup an exec into container goes to: its
// OwnLeaf if it has one (cgroup v2). Without this, libcontainer's fallback
// for a cgroup that refuses processes is the init's cgroup, which is a
// frozen one while the container is sealed frozen for its branches.
func execCgroup(container *libcontainer.Container) string {
	if !cgroups.IsCgroup2UnifiedMode() {
		return ""
	}
	st, err := container.State()
	if err != nil {
		return ""
	}
	dir, ok := st.CgroupPaths[""]
	if !ok || dir == "" {
		return ""
	}
	if fi, err := os.Stat(filepath.Join(dir, OwnLeaf)); err != nil || !fi.IsDir() {
		return ""
	}
	return OwnLeaf
}

func parseSignal(raw string) (unix.Signal, error) {
	if s, err := strconv.Atoi(raw); err == nil {
		return unix.Signal(s), nil
	}
	sig := strings.ToUpper(raw)
	if !strings.HasPrefix(sig, "SIG") {
		sig = "SIG" + sig
	}
	if s := unix.SignalNum(sig); s != 0 {
		return s, nil
	}
	return -1, fmt.Errorf("unknown signal %q", raw)
}

func kill(c *cmdline) error {
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	sigstr := "SIGTERM"
	if len(c.args) > 1 {
		sigstr = c.args[1]
	}
	sig, err := parseSignal(sigstr)
	if err != nil {
		return err
	}
	err = container.Signal(sig)
	if errors.Is(err, libcontainer.ErrNotRunning) && c.bool("all") {
		err = nil
	}
	return err
}

// deleteContainer is runc delete. With --force (containerd's cleanup path
// after a shim died) every process in the container's cgroup is killed,
// frozen ones included, before the cgroup and state are removed.
func deleteContainer(c *cmdline) error {
	id := c.args[0]
	force := c.bool("force")
	// A restore killed midway (its shim killed, the CRIU of it killed by
	// the cleanup) leaves libcontainer's bind mount of the rootfs in the
	// container's state directory (criu-root), which it unmounts only on
	// return; the directory cannot be removed with it.
	path := filepath.Join(c.g.root, id)
	_ = unix.Unmount(filepath.Join(path, "criu-root"), unix.MNT_DETACH)
	container, err := getContainer(c)
	if err != nil {
		if errors.Is(err, libcontainer.ErrNotExist) {
			// An aborted create can leave the directory without state.json.
			if e := os.RemoveAll(path); e != nil {
				fmt.Fprintf(os.Stderr, "remove %s: %v\n", path, e)
			}
			if force {
				return nil
			}
		}
		return err
	}
	if force {
		return killContainer(container)
	}
	s, err := container.Status()
	if err != nil {
		return err
	}
	switch s {
	case libcontainer.Stopped:
		if err := dropHooksIfKept(c, bundleOf(container)); err != nil {
			return err
		}
		if container, err = getContainer(c); err != nil {
			return err
		}
		// Processes that outlived init (a shared PID namespace, or ones
		// that entered the cgroup some other way) go too.
		if err := killCgroup(container); err != nil {
			logrus.WithError(err).Warn("kill leftover processes")
		}
		return container.Destroy()
	case libcontainer.Created:
		return killContainer(container)
	default:
		return fmt.Errorf("cannot delete container %s that is not stopped: %s", id, s)
	}
}

func killContainer(container *libcontainer.Container) error {
	_ = container.Signal(unix.SIGKILL)
	for range 100 {
		if err := container.Signal(unix.Signal(0)); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := container.Signal(unix.Signal(0)); err == nil {
		return errors.New("container init still running")
	}
	if err := killCgroup(container); err != nil {
		logrus.WithError(err).Warn("kill leftover processes")
	}
	return container.Destroy()
}

// killCgroup SIGKILLs whatever is still in the container's cgroup and waits
// for it to empty, so that removing the cgroup cannot fail with EBUSY. On
// cgroup v1 a frozen task ignores SIGKILL, so the cgroup is thawed first.
func killCgroup(container *libcontainer.Container) error {
	st, err := container.State()
	if err != nil {
		return err
	}
	cfg := container.Config()
	if cfg.Cgroups == nil {
		return nil
	}
	m, err := newCgroupManager(cfg.Cgroups, st.CgroupPaths)
	if err != nil {
		return err
	}
	if !m.Exists() {
		return nil
	}
	_ = m.Freeze(cgroups.Thawed)
	for range 250 {
		pids, err := m.GetAllPids()
		if err != nil || len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				logrus.WithError(err).WithField("pid", pid).Warn("kill")
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("processes still in the container's cgroup after 5s of SIGKILL")
}

// containerState is what runc state prints.
type containerState struct {
	Version        string            `json:"ociVersion"`
	ID             string            `json:"id"`
	InitProcessPid int               `json:"pid"`
	Status         string            `json:"status"`
	Bundle         string            `json:"bundle"`
	Rootfs         string            `json:"rootfs"`
	Created        time.Time         `json:"created"`
	Annotations    map[string]string `json:"annotations,omitempty"`
}

func state(c *cmdline) error {
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	status, err := container.Status()
	if err != nil {
		return err
	}
	st, err := container.State()
	if err != nil {
		return err
	}
	pid := st.BaseState.InitProcessPid
	if status == libcontainer.Stopped {
		pid = 0
	}
	bundle, annotations := utils.Annotations(st.Config.Labels)
	data, err := json.MarshalIndent(containerState{
		Version:        st.BaseState.Config.Version,
		ID:             st.BaseState.ID,
		InitProcessPid: pid,
		Status:         status.String(),
		Bundle:         bundle,
		Rootfs:         st.BaseState.Config.Rootfs,
		Created:        st.BaseState.Created,
		Annotations:    annotations,
	}, "", "  ")
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(data)
	return err
}

func ps(c *cmdline) error {
	if f := c.str("format"); f != "json" {
		return fmt.Errorf("ps: only --format json is supported, got %q", f)
	}
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	pids, err := container.Processes()
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(pids)
}

func pause(c *cmdline) error {
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	return container.Pause()
}

func resume(c *cmdline) error {
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	return container.Resume()
}

// dialConsole connects to the console socket the shim listens on; the
// container's pty master is sent over it by libcontainer.
func dialConsole(path string) (*os.File, net.Conn, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("console socket %s: %w", path, err)
	}
	f, err := conn.(*net.UnixConn).File()
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return f, conn, nil
}
