//go:build linux

package ocirt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/opencontainers/cgroups"
	cgmanager "github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/capabilities"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runc/libcontainer/system"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/cgroupfit"
)

// runner is runc's runner, reduced to the detached case: the task service
// always detaches, handing the container either its own stdio (fifos it
// opened) or, for a terminal, a console socket to receive the pty master on.
type runner struct {
	container     *libcontainer.Container
	init          bool
	shouldDestroy bool
	subreaper     bool
	consoleSocket string
	pidFile       string
	preserveFDs   int
	subCgroup     string                 // cgroup v2: where below the container's an exec goes
	restore       *libcontainer.CriuOpts // restore the init from a checkpoint instead
}

func (r *runner) run(config *specs.Process) (retErr error) {
	defer func() {
		if retErr != nil && r.shouldDestroy {
			if err := r.container.Destroy(); err != nil {
				logrus.Warn(err)
			}
		}
	}()
	if config.Terminal && r.consoleSocket == "" {
		return errors.New("cannot allocate tty if runc will detach without setting console socket")
	}
	if !config.Terminal && r.consoleSocket != "" {
		return errors.New("cannot use console socket if runc will not detach or allocate tty")
	}
	process, err := newProcess(config)
	if err != nil {
		return err
	}
	process.LogLevel = strconv.Itoa(int(logrus.GetLevel()))
	process.Init = r.init
	if r.subCgroup != "" {
		process.SubCgroupPaths = map[string]string{"": r.subCgroup}
	}
	baseFd := 3 + len(process.ExtraFiles)
	for i := baseFd; i < baseFd+r.preserveFDs; i++ {
		if _, err := os.Stat("/proc/self/fd/" + strconv.Itoa(i)); err != nil {
			return fmt.Errorf("unable to stat preserved-fd %d (of %d): %w", i-baseFd, r.preserveFDs, err)
		}
		process.ExtraFiles = append(process.ExtraFiles, os.NewFile(uintptr(i), "PreserveFD:"+strconv.Itoa(i)))
	}
	if r.subreaper {
		// As runc create does: the container's init is reparented to us,
		// then to the shim (a subreaper too) when we exit.
		if err := system.SetSubreaper(1); err != nil {
			logrus.Warn(err)
		}
	}
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	if config.Terminal {
		process.Stdin, process.Stdout, process.Stderr = nil, nil, nil
		sock, conn, err := dialConsole(r.consoleSocket)
		if err != nil {
			return err
		}
		closers = append(closers, conn, sock)
		process.ConsoleSocket = sock
	} else {
		process.Stdin, process.Stdout, process.Stderr = os.Stdin, os.Stdout, os.Stderr
	}
	switch {
	case r.restore != nil:
		err = r.container.Restore(process, r.restore)
	case r.init:
		err = r.container.Start(process)
	default:
		err = r.container.Run(process)
	}
	if err != nil {
		return err
	}
	if r.pidFile != "" {
		if err := createPidFile(r.pidFile, process); err != nil {
			_ = process.Signal(unix.SIGKILL)
			_, _ = process.Wait()
			return err
		}
	}
	return nil
}

// createPidFile writes the pid atomically (create and rename): the task
// service reads it as soon as we exit.
func createPidFile(path string, process *libcontainer.Process) error {
	pid, err := process.Pid()
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path))
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_SYNC, 0o666)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(pid))
	f.Close()
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func validateProcessSpec(spec *specs.Process) error {
	if spec == nil {
		return errors.New("process property must not be empty")
	}
	if spec.Cwd == "" {
		return errors.New("cwd property must not be empty")
	}
	if !filepath.IsAbs(spec.Cwd) {
		return errors.New("cwd must be an absolute path")
	}
	if len(spec.Args) == 0 {
		return errors.New("args must not be empty")
	}
	return nil
}

// newProcess converts a spec process to a libcontainer one (runc's newProcess).
func newProcess(p *specs.Process) (*libcontainer.Process, error) {
	lp := &libcontainer.Process{
		Args:            p.Args,
		Env:             p.Env,
		UID:             int(p.User.UID),
		GID:             int(p.User.GID),
		Cwd:             p.Cwd,
		Label:           p.SelinuxLabel,
		NoNewPrivileges: &p.NoNewPrivileges,
		AppArmorProfile: p.ApparmorProfile,
		Scheduler:       p.Scheduler,
		IOPriority:      p.IOPriority,
	}
	if p.ConsoleSize != nil {
		lp.ConsoleWidth = uint16(p.ConsoleSize.Width)
		lp.ConsoleHeight = uint16(p.ConsoleSize.Height)
	}
	if p.Capabilities != nil {
		lp.Capabilities = &configs.Capabilities{
			Bounding:    p.Capabilities.Bounding,
			Effective:   p.Capabilities.Effective,
			Inheritable: p.Capabilities.Inheritable,
			Permitted:   p.Capabilities.Permitted,
			Ambient:     p.Capabilities.Ambient,
		}
	}
	for _, g := range p.User.AdditionalGids {
		lp.AdditionalGroups = append(lp.AdditionalGroups, int(g))
	}
	for _, rl := range p.Rlimits {
		t, err := rlimitType(rl.Type)
		if err != nil {
			return nil, err
		}
		lp.Rlimits = append(lp.Rlimits, configs.Rlimit{Type: t, Hard: rl.Hard, Soft: rl.Soft})
	}
	aff, err := configs.ConvertCPUAffinity(p.ExecCPUAffinity)
	if err != nil {
		return nil, err
	}
	lp.CPUAffinity = aff
	return lp, nil
}

func rlimitType(key string) (int, error) {
	switch key {
	case "RLIMIT_CPU":
		return unix.RLIMIT_CPU, nil
	case "RLIMIT_FSIZE":
		return unix.RLIMIT_FSIZE, nil
	case "RLIMIT_DATA":
		return unix.RLIMIT_DATA, nil
	case "RLIMIT_STACK":
		return unix.RLIMIT_STACK, nil
	case "RLIMIT_CORE":
		return unix.RLIMIT_CORE, nil
	case "RLIMIT_RSS":
		return unix.RLIMIT_RSS, nil
	case "RLIMIT_NPROC":
		return unix.RLIMIT_NPROC, nil
	case "RLIMIT_NOFILE":
		return unix.RLIMIT_NOFILE, nil
	case "RLIMIT_MEMLOCK":
		return unix.RLIMIT_MEMLOCK, nil
	case "RLIMIT_AS":
		return unix.RLIMIT_AS, nil
	case "RLIMIT_LOCKS":
		return unix.RLIMIT_LOCKS, nil
	case "RLIMIT_SIGPENDING":
		return unix.RLIMIT_SIGPENDING, nil
	case "RLIMIT_MSGQUEUE":
		return unix.RLIMIT_MSGQUEUE, nil
	case "RLIMIT_NICE":
		return unix.RLIMIT_NICE, nil
	case "RLIMIT_RTPRIO":
		return unix.RLIMIT_RTPRIO, nil
	case "RLIMIT_RTTIME":
		return unix.RLIMIT_RTTIME, nil
	}
	return 0, fmt.Errorf("wrong rlimit value: %s", key)
}

func newCgroupManager(cg *cgroups.Cgroup, paths map[string]string) (cgroups.Manager, error) {
	return cgmanager.NewWithPaths(cg, paths)
}

// update is runc update --resources=FILE|-, the only form go-runc uses.
func update(c *cmdline) error {
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	r, err := readResources(c)
	if err != nil {
		return err
	}
	config := container.Config()
	setResources(config.Cgroups.Resources, r)
	// Like runc update: device rules cannot change here.
	config.Cgroups.SkipDevices = true
	st, err := container.State()
	if err != nil {
		return err
	}
	// The branch cgroups below the container's first, which cgroup v1
	// would otherwise keep from this update. A warm init's cgroup made
	// meanwhile (the pool refills on its own) may copy the old cpuset:
	// the kernel's EBUSY then, and one more round.
	for try := 0; ; try++ {
		if err := cgroupfit.Update(st.CgroupPaths, config.Cgroups.Resources); err != nil {
			return fmt.Errorf("make the branch cgroups below the container fit its update: %w", err)
		}
		err := container.Set(config)
		if err == nil || try == 1 || !errors.Is(err, unix.EBUSY) {
			return err
		}
	}
}

// readResources reads the resources of --resources (a file, or "-" for
// stdin), each section present, and a memory limit of -1 (none) with no
// swap limit given as no swap limit either.
func readResources(c *cmdline) (*specs.LinuxResources, error) {
	in := c.str("resources")
	if in == "" {
		return nil, errors.New("update needs --resources")
	}
	f := os.Stdin
	if in != "-" {
		var err error
		if f, err = os.Open(in); err != nil {
			return nil, err
		}
		defer f.Close()
	}
	r := specs.LinuxResources{
		Memory:  &specs.LinuxMemory{CheckBeforeUpdate: new(bool)},
		CPU:     &specs.LinuxCPU{},
		BlockIO: &specs.LinuxBlockIO{},
		Pids:    &specs.LinuxPids{},
	}
	if err := json.NewDecoder(f).Decode(&r); err != nil {
		return nil, fmt.Errorf("decode resources: %w", err)
	}
	if r.Memory == nil {
		r.Memory = &specs.LinuxMemory{}
	}
	if r.CPU == nil {
		r.CPU = &specs.LinuxCPU{}
	}
	if r.BlockIO == nil {
		r.BlockIO = &specs.LinuxBlockIO{}
	}
	if r.Pids == nil {
		r.Pids = &specs.LinuxPids{}
	}
	if r.Memory.Limit != nil && *r.Memory.Limit == -1 && r.Memory.Swap == nil {
		zero := int64(0)
		r.Memory.Swap = &zero
	}
	return &r, nil
}

// setResources sets the resources r on res, as runc update does.
func setResources(res *cgroups.Resources, r *specs.LinuxResources) {
	if r.BlockIO.Weight != nil {
		res.BlkioWeight = *r.BlockIO.Weight
	}
	var p uint64
	var q int64
	if r.CPU.Period != nil {
		p = *r.CPU.Period
	}
	if r.CPU.Quota != nil {
		q = *r.CPU.Quota
	}
	switch {
	case (p == 0 && q == 0) || (p != 0 && q != 0):
		res.CpuPeriod, res.CpuQuota = p, q
	case p != 0:
		res.CpuPeriod = p
	default:
		res.CpuQuota = q
	}
	res.CpuBurst = r.CPU.Burst
	if r.CPU.Shares != nil {
		res.CpuShares = *r.CPU.Shares
		res.CpuWeight = cgroups.ConvertCPUSharesToCgroupV2Value(*r.CPU.Shares)
	}
	if r.CPU.RealtimePeriod != nil {
		res.CpuRtPeriod = *r.CPU.RealtimePeriod
	}
	if r.CPU.RealtimeRuntime != nil {
		res.CpuRtRuntime = *r.CPU.RealtimeRuntime
	}
	res.CpusetCpus = r.CPU.Cpus
	res.CpusetMems = r.CPU.Mems
	if r.Memory.Limit != nil {
		res.Memory = *r.Memory.Limit
	}
	res.CPUIdle = r.CPU.Idle
	if r.Memory.Reservation != nil {
		res.MemoryReservation = *r.Memory.Reservation
	}
	if r.Memory.Swap != nil {
		res.MemorySwap = *r.Memory.Swap
	}
	if r.Memory.CheckBeforeUpdate != nil {
		res.MemoryCheckBeforeUpdate = *r.Memory.CheckBeforeUpdate
	}
	res.PidsLimit = r.Pids.Limit
	res.Unified = r.Unified
}

// statsEvent is the shape of runc events --stats output that go-runc
// decodes; only the fields it reads are filled.
type statsEvent struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Data any    `json:"data,omitempty"`
}

func events(c *cmdline) error {
	if !c.bool("stats") {
		return errors.New("events: only --stats is supported")
	}
	container, err := getContainer(c)
	if err != nil {
		return err
	}
	status, err := container.Status()
	if err != nil {
		return err
	}
	if status == libcontainer.Stopped {
		return fmt.Errorf("container with id %s is not running", container.ID())
	}
	s, err := container.Stats()
	if err != nil {
		return err
	}
	data := map[string]any{}
	if cg := s.CgroupStats; cg != nil {
		data["pids"] = map[string]any{"current": cg.PidsStats.Current, "limit": cg.PidsStats.Limit}
		data["cpu"] = map[string]any{"usage": map[string]any{
			"total": cg.CpuStats.CpuUsage.TotalUsage, "kernel": cg.CpuStats.CpuUsage.UsageInKernelmode,
			"user": cg.CpuStats.CpuUsage.UsageInUsermode, "percpu": cg.CpuStats.CpuUsage.PercpuUsage,
		}}
		data["memory"] = map[string]any{
			"cache": cg.MemoryStats.Cache,
			"usage": map[string]any{"usage": cg.MemoryStats.Usage.Usage, "limit": cg.MemoryStats.Usage.Limit, "max": cg.MemoryStats.Usage.MaxUsage},
			"raw":   cg.MemoryStats.Stats,
		}
	}
	return json.NewEncoder(os.Stdout).Encode(statsEvent{Type: "stats", ID: container.ID(), Data: data})
}

// Features describes what this runtime supports, as runc features does.
func Features() *features.Features {
	t := true
	feat := &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: specs.Version,
		Hooks:         configs.KnownHookNames(),
		MountOptions:  specconv.KnownMountOptions(),
		Linux: &features.Linux{
			Namespaces:   specconv.KnownNamespaces(),
			Capabilities: capabilities.KnownCapabilities(),
			// Systemd: --systemd-cgroup (runc's option SystemdCgroup) is
			// libcontainer's systemd manager, as in runc.
			Cgroup: &features.Cgroup{V1: &t, V2: &t, Systemd: &t},
			// libcontainer makes id-mapped mounts (a mount's uidMappings
			// and gidMappings), as runc does; containerd's CRI refuses a
			// pod user namespace (hostUsers: false) to a runtime without.
			MountExtensions: &features.MountExtensions{IDMap: &features.IDMap{Enabled: &t}},
		},
	}
	if seccomp.Enabled {
		feat.Linux.Seccomp = &features.Seccomp{
			Enabled:   &t,
			Actions:   seccomp.KnownActions(),
			Operators: seccomp.KnownOperators(),
			Archs:     seccomp.KnownArchs(),
		}
	}
	return feat
}

func printFeatures() error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "    ")
	return enc.Encode(Features())
}
