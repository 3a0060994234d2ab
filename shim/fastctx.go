//go:build linux

package shim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/console"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"github.com/moby/sys/capability"
	"github.com/opencontainers/cgroups"
	devconfig "github.com/opencontainers/cgroups/devices/config"
	cgmanager "github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// InitBinary is the branch init (cmd/containerd-shim-branch-v1/init),
// looked for beside the shim. With it, a branch starts without the runtime:
// the shim makes the cgroup and starts the init in the branch's new
// namespaces, and the init, which is C run before any Go runtime starts,
// builds the root and runs the branch's processes on the shim's word. That
// spares two runs of a Go binary and libcontainer's set-up per branch.
const InitBinary = "containerd-shim-branch-v1-init"

// fastInit is the init binary beside self, or "" if it is not installed.
func fastInit(self string) string {
	p := filepath.Join(filepath.Dir(self), InitBinary)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return p
	}
	return ""
}

// fastUnsupported says why a branch of this spec must be run by the
// runtime (libcontainer) instead of the init, or "" if the init can.
// recursiveMountAttr says whether o is a mount option the runtime applies
// to a mount and every mount below it (mount_setattr AT_RECURSIVE), as
// runc's specconv knows them ("rro" is what the CRI gives a recursive
// read-only mount).
func recursiveMountAttr(o string) bool {
	switch o {
	case "rro", "rrw", "rnosuid", "rsuid", "rnodev", "rdev", "rnoexec", "rexec",
		"rnodiratime", "rdiratime", "rrelatime", "rnorelatime", "rnoatime", "ratime",
		"rstrictatime", "rnostrictatime", "rnosymfollow", "rsymfollow":
		return true
	}
	return false
}

func fastUnsupported(s *specs.Spec) string {
	if s.Process == nil || s.Linux == nil {
		return "no process or linux section"
	}
	l := s.Linux
	switch {
	case l.Seccomp != nil && seccompNotifies(l.Seccomp):
		return "seccomp profile with a notify action or a listener (the runtime hands its listener to the agent)"
	case s.Process.SelinuxLabel != "" || l.MountLabel != "":
		return "selinux labels"
	case len(l.UIDMappings) > 0 || len(l.GIDMappings) > 0:
		return "user namespace"
	case l.IntelRdt != nil:
		return "intel rdt"
	case l.Personality != nil:
		return "personality"
	case l.MemoryPolicy != nil:
		return "numa memory policy"
	}
	// The init keeps every capability (it starts the branch's processes
	// with theirs); only its being unreadable and untraceable from the
	// branch keeps it out of the branch's reach, and a branch that may
	// ptrace with CAP_SYS_PTRACE could take it over.
	if c := s.Process.Capabilities; c != nil {
		for _, name := range c.Bounding {
			if strings.EqualFold(name, "CAP_SYS_PTRACE") {
				return "CAP_SYS_PTRACE"
			}
		}
	}
	for _, n := range l.Namespaces {
		if n.Type == specs.UserNamespace {
			return "user namespace"
		}
	}
	for _, m := range s.Mounts {
		if len(m.UIDMappings) > 0 || len(m.GIDMappings) > 0 {
			return "id-mapped mount"
		}
		for _, o := range m.Options {
			if recursiveMountAttr(o) {
				// The init's bind sets flags on the top mount only: a
				// recursive read-only mount would leave its submounts
				// writable in the branch.
				return "recursive mount attribute " + o
			}
		}
	}
	return ""
}

// cfgWriter encodes the init's instructions: NUL-terminated strings. It
// keeps them as ops too, for splitPrep.
type cfgWriter struct {
	bytes.Buffer
	ops [][]string
}

func (w *cfgWriter) op(name string, args ...string) {
	w.ops = append(w.ops, append([]string{name}, args...))
	w.WriteString(name)
	w.WriteByte(0)
	for _, a := range args {
		w.WriteString(a)
		w.WriteByte(0)
	}
}

func hex(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }

// capBits turns capability names into the kernel's bit mask.
func capBits(names []string) (uint64, error) {
	var m uint64
	for _, n := range names {
		found := false
		for _, c := range capability.ListKnown() {
			if strings.EqualFold(n, "CAP_"+c.String()) {
				m |= 1 << uint(c)
				found = true
				break
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown capability %q: %w", n, errdefs.ErrInvalidArgument)
		}
	}
	return m, nil
}

// writeProc encodes a process: its command, environment, user,
// capabilities, limits and scheduling. exec is true for a process exec'd
// into the branch (runc's setns process, which takes the spec's
// execCPUAffinity), false for the branch's command (runc's init).
func writeProc(w *cfgWriter, p *specs.Process, cfg *configs.Config, exec bool) error {
	for _, a := range p.Args {
		w.op("arg", a)
	}
	for _, e := range p.Env {
		w.op("env", e)
	}
	w.op("cwd", p.Cwd)
	w.op("user", strconv.FormatUint(uint64(p.User.UID), 10), strconv.FormatUint(uint64(p.User.GID), 10))
	for _, g := range p.User.AdditionalGids {
		w.op("group", strconv.FormatUint(uint64(g), 10))
	}
	if p.User.Umask != nil {
		w.op("umask", strconv.FormatUint(uint64(*p.User.Umask), 10))
	}
	var sets [5]uint64
	if c := p.Capabilities; c != nil {
		for i, names := range [][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
			b, err := capBits(names)
			if err != nil {
				return err
			}
			sets[i] = b
		}
	}
	w.op("caps", hex(sets[0]), hex(sets[1]), hex(sets[2]), hex(sets[3]), hex(sets[4]))
	if p.NoNewPrivileges {
		w.op("nnp")
	}
	if p.ApparmorProfile != "" {
		// Written to the process's AppArmor exec attribute, as runc
		// does; on a host without AppArmor that fails, as it does in
		// runc.
		w.op("apparmor", p.ApparmorProfile)
	}
	if p.Terminal {
		w.op("term")
	}
	if cfg.OomScoreAdj != nil {
		w.op("oom", strconv.Itoa(*cfg.OomScoreAdj))
	}
	for _, r := range p.Rlimits {
		t, ok := rlimitNumber(r.Type)
		if !ok {
			return fmt.Errorf("unknown rlimit %q: %w", r.Type, errdefs.ErrInvalidArgument)
		}
		w.op("rlimit", strconv.Itoa(t), strconv.FormatUint(r.Soft, 10), strconv.FormatUint(r.Hard, 10))
	}
	return writeSched(w, p, exec)
}

// writeSched encodes a process's scheduler, I/O priority and CPU affinity
// as runc applies them (libcontainer's setupScheduler, setupIOPriority and
// its setns process's CPU affinity, which is reset to every CPU unless the
// spec names the final set).
func writeSched(w *cfgWriter, p *specs.Process, exec bool) error {
	if p.Scheduler != nil {
		a, err := configs.ToSchedAttr(p.Scheduler)
		if err != nil {
			return fmt.Errorf("scheduler: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		w.op("sched", strconv.FormatUint(uint64(a.Policy), 10), strconv.FormatUint(a.Flags, 10),
			strconv.FormatInt(int64(a.Nice), 10), strconv.FormatUint(uint64(a.Priority), 10),
			strconv.FormatUint(a.Runtime, 10), strconv.FormatUint(a.Deadline, 10), strconv.FormatUint(a.Period, 10))
	}
	if io := p.IOPriority; io != nil {
		class := 0
		switch io.Class {
		case specs.IOPRIO_CLASS_RT:
			class = 1
		case specs.IOPRIO_CLASS_BE:
			class = 2
		case specs.IOPRIO_CLASS_IDLE:
			class = 3
		default:
			return fmt.Errorf("invalid io priority class %q: %w", io.Class, errdefs.ErrInvalidArgument)
		}
		w.op("ioprio", strconv.Itoa(class<<13|io.Priority))
	}
	var final *unix.CPUSet
	if exec && p.ExecCPUAffinity != nil {
		aff, err := configs.ConvertCPUAffinity(p.ExecCPUAffinity)
		if err != nil {
			return fmt.Errorf("cpu affinity: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if aff != nil {
			final = aff.Final
		}
	}
	if final == nil {
		// As runc: every CPU (the kernel masks it with the cgroup's
		// cpuset), not the shim's affinity.
		w.op("affinity", "")
		return nil
	}
	var b []byte
	for _, word := range final {
		b = binary.NativeEndian.AppendUint64(b, uint64(word))
	}
	w.op("affinity", hexBytes(b))
	return nil
}

func hexBytes(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// rlimitNumber is the kernel's number of an OCI rlimit name.
func rlimitNumber(name string) (int, bool) {
	switch name {
	case "RLIMIT_CPU":
		return unix.RLIMIT_CPU, true
	case "RLIMIT_FSIZE":
		return unix.RLIMIT_FSIZE, true
	case "RLIMIT_DATA":
		return unix.RLIMIT_DATA, true
	case "RLIMIT_STACK":
		return unix.RLIMIT_STACK, true
	case "RLIMIT_CORE":
		return unix.RLIMIT_CORE, true
	case "RLIMIT_RSS":
		return unix.RLIMIT_RSS, true
	case "RLIMIT_NPROC":
		return unix.RLIMIT_NPROC, true
	case "RLIMIT_NOFILE":
		return unix.RLIMIT_NOFILE, true
	case "RLIMIT_MEMLOCK":
		return unix.RLIMIT_MEMLOCK, true
	case "RLIMIT_AS":
		return unix.RLIMIT_AS, true
	case "RLIMIT_LOCKS":
		return 10, true
	case "RLIMIT_SIGPENDING":
		return 11, true
	case "RLIMIT_MSGQUEUE":
		return 12, true
	case "RLIMIT_NICE":
		return 13, true
	case "RLIMIT_RTPRIO":
		return 14, true
	case "RLIMIT_RTTIME":
		return 15, true
	}
	return 0, false
}

// cloneFlags are the namespaces a branch init is cloned into: new PID and
// mount namespaces, and the spec's new IPC, UTS and network namespaces (a
// cgroup namespace is made once the init is in its cgroup; namespaces with
// a path are joined).
func cloneFlags(spec *specs.Spec) uintptr {
	f := uintptr(unix.CLONE_NEWPID | unix.CLONE_NEWNS)
	for _, n := range spec.Linux.Namespaces {
		if n.Path != "" {
			continue
		}
		switch n.Type {
		case specs.IPCNamespace:
			f |= unix.CLONE_NEWIPC
		case specs.UTSNamespace:
			f |= unix.CLONE_NEWUTS
		case specs.NetworkNamespace:
			f |= unix.CLONE_NEWNET
		}
	}
	return f
}

// fastPlan is what the init is told to build, and how it is cloned.
type fastPlan struct {
	cfg        *configs.Config
	cloneFlags uintptr
	conf       cfgWriter
}

// planFast converts a branch's spec (with runc's own conversion, so that
// mount options, devices and limits mean what they mean to runc) into the
// init's instructions. cgroupPaths are the branch's cgroup directories;
// seccomp is the spec's profile compiled (nil for none).
func planFast(spec *specs.Spec, rootfs string, cgroupPaths map[string]string, seccomp *compiledSeccomp) (*fastPlan, error) {
	s := *spec
	s.Root = &specs.Root{Path: rootfs, Readonly: spec.Root != nil && spec.Root.Readonly}
	if spec.Linux.Seccomp != nil {
		// The profile comes compiled (once per sandbox); converting it
		// again would cost half a millisecond of every branch.
		l := *spec.Linux
		l.Seccomp = nil
		s.Linux = &l
	}
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{CgroupName: filepath.Base(rootfs), Spec: &s})
	if err != nil {
		return nil, fmt.Errorf("convert the branch spec: %w", err)
	}
	p := &fastPlan{cfg: cfg, cloneFlags: cloneFlags(spec)}
	w := &p.conf
	newUTS, newNet := p.cloneFlags&unix.CLONE_NEWUTS != 0, p.cloneFlags&unix.CLONE_NEWNET != 0
	var joins []string
	for _, n := range cfg.Namespaces {
		switch n.Type {
		case configs.NEWPID, configs.NEWNS:
		case configs.NEWCGROUP:
			if n.Path == "" {
				// After the shim put the init in its cgroup.
				w.op("cgroupns")
				continue
			}
			joins = append(joins, n.Path)
		case configs.NEWIPC, configs.NEWUTS, configs.NEWNET:
			if n.Path != "" {
				joins = append(joins, n.Path)
			}
		case configs.NEWTIME:
			if n.Path != "" {
				joins = append(joins, n.Path)
				continue
			}
			// A new time namespace for the processes the init starts,
			// with the spec's clock offsets, as runc's nsexec makes it.
			var offsets strings.Builder
			for clock, o := range cfg.TimeOffsets {
				fmt.Fprintf(&offsets, "%s %d %d\n", clock, o.Secs, o.Nanosecs)
			}
			w.op("timens", offsets.String())
		default:
			return nil, fmt.Errorf("namespace %s: %w", n.Type, errdefs.ErrNotImplemented)
		}
	}
	for _, j := range joins {
		w.op("setns", j)
	}
	w.op("root", rootfs)
	devTmpfs := false
	for _, m := range cfg.Mounts {
		flags := m.Flags
		switch {
		case m.Device == "bind":
			w.op("bind", m.Source, m.Destination, strconv.Itoa(flags), boolStr(flags&unix.MS_REC != 0))
		case m.Device == "cgroup" || m.Device == "cgroup2":
			cgroupMountsPlan(w, m, cgroupPaths)
		default:
			if m.Destination == "/dev" && m.Device == "tmpfs" {
				devTmpfs = true
			}
			w.op("mount", m.Source, m.Destination, m.Device, strconv.Itoa(flags), m.Data)
		}
	}
	if devTmpfs {
		for _, d := range cfg.Devices {
			mode := uint32(d.FileMode.Perm())
			switch d.Type {
			case devconfig.CharDevice:
				mode |= unix.S_IFCHR
			case devconfig.BlockDevice:
				mode |= unix.S_IFBLK
			case devconfig.FifoDevice:
				mode |= unix.S_IFIFO
			default:
				continue
			}
			w.op("mknod", d.Path, strconv.FormatUint(uint64(mode), 10), strconv.FormatInt(d.Major, 10),
				strconv.FormatInt(d.Minor, 10), strconv.FormatUint(uint64(d.Uid), 10), strconv.FormatUint(uint64(d.Gid), 10))
		}
		for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}, {"pts/ptmx", "/dev/ptmx"}} {
			w.op("symlink", l[0], l[1])
		}
	}
	w.op("pivot")
	for _, m := range cfg.MaskPaths {
		w.op("mask", m)
	}
	for _, r := range cfg.ReadonlyPaths {
		w.op("readonly", r)
	}
	for k, v := range cfg.Sysctl {
		w.op("write", "/proc/sys/"+strings.ReplaceAll(k, ".", "/"), v)
	}
	if newUTS && cfg.Hostname != "" {
		w.op("hostname", cfg.Hostname)
	}
	if newUTS && cfg.Domainname != "" {
		w.op("domainname", cfg.Domainname)
	}
	if newNet {
		w.op("lo")
	}
	if cfg.Readonlyfs {
		w.op("rootro")
	}
	seccompPlan(w, seccomp)
	return p, nil
}

func boolStr(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// cgroupMountsPlan mounts the branch's own cgroup directories at the cgroup
// mount's destination, as runc does on cgroup v1: a tmpfs holding a bind of
// each hierarchy's directory, and links for co-mounted controllers.
func cgroupMountsPlan(w *cfgWriter, m *configs.Mount, paths map[string]string) {
	ro := m.Flags&unix.MS_RDONLY != 0
	bindFlags := (m.Flags | unix.MS_BIND) &^ unix.MS_REC
	if cgroups.IsCgroup2UnifiedMode() {
		if p, ok := paths[""]; ok {
			w.op("bind", p, m.Destination, strconv.Itoa(bindFlags), "0")
		}
		return
	}
	w.op("mount", "tmpfs", m.Destination, "tmpfs", strconv.Itoa(unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV), "mode=755")
	seen := map[string]bool{}
	for _, dir := range paths {
		// dir is <hierarchy mount point>/<cgroup path>; the hierarchy's
		// name is the mount point's last element ("cpu,cpuacct").
		hier := dir
		for filepath.Dir(hier) != "/sys/fs/cgroup" && hier != "/" {
			hier = filepath.Dir(hier)
		}
		name := filepath.Base(hier)
		if hier == "/" || seen[name] {
			continue
		}
		seen[name] = true
		w.op("bind", dir, filepath.Join(m.Destination, name), strconv.Itoa(bindFlags), "0")
		if strings.Contains(name, ",") {
			for _, c := range strings.Split(name, ",") {
				w.op("symlink", name, filepath.Join(m.Destination, c))
			}
		}
	}
	if ro {
		w.op("remount", m.Destination, strconv.Itoa(unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV))
	}
}

// setLimits writes the limits given at fork into a branch's cgroup.
func setLimits(paths map[string]string, l *shimv1.Limits) error {
	if l == nil {
		return nil
	}
	write := func(ctrl, file, v string) error {
		dir, ok := paths[ctrl]
		if !ok {
			return fmt.Errorf("no %s cgroup for limit %s: %w", ctrl, file, errdefs.ErrNotImplemented)
		}
		return cgroups.WriteFile(dir, file, v)
	}
	v2 := cgroups.IsCgroup2UnifiedMode()
	if l.Memory > 0 {
		m := strconv.FormatInt(l.Memory, 10)
		if v2 {
			if err := write("", "memory.max", m); err != nil {
				return err
			}
		} else if err := write("memory", "memory.limit_in_bytes", m); err != nil {
			return err
		}
	}
	if l.Cpus > 0 {
		quota := strconv.FormatInt(int64(l.Cpus*100000), 10)
		if v2 {
			if err := write("", "cpu.max", quota+" 100000"); err != nil {
				return err
			}
		} else if err := write("cpu", "cpu.cfs_period_us", "100000"); err != nil {
			return err
		} else if err := write("cpu", "cpu.cfs_quota_us", quota); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		ctrl := "pids"
		if v2 {
			ctrl = ""
		}
		if err := write(ctrl, "pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	return nil
}

// fastCtx is a branch context run by the init: the init's control socket,
// and the processes it started for the shim.
type fastCtx struct {
	init *fastProc // the init; its exit comes from the shim's reaper
	ctl  *net.UnixConn
	cfg  *configs.Config

	sendMu sync.Mutex // an exec request and its reply

	mu      sync.Mutex
	byID    map[string]*fastProc
	byPid   map[int]*fastProc // by pid in the branch
	waiting []*fastProc       // sent, not yet given a pid
	closed  bool
}

// spawned is a branch init started in new namespaces and being moved into
// its cgroup, waiting for its instructions.
type spawned struct {
	init   *fastProc
	ctl    *net.UnixConn
	cgroup string            // its cgroup path
	paths  map[string]string // its cgroup's directories, by controller
	flags  uintptr           // the namespaces it was cloned with
	joined chan error        // the move into the cgroup, once done
	// prepped is the early part of a plan it ran (splitPrep), or nil.
	prepped []byte
}

// spawn makes a cgroup and starts an init in new namespaces (flags),
// inside the cgroup's pids and memory cgroups (startIn), so that the
// process limits above it hold from its first instant. On the other v1
// hierarchies it is moved in the background while it can already build
// a root; a fork refused by a process limit is a *pidsLimit.
func (c *contexts) spawn(ctx context.Context, cgroupPath string, flags uintptr) (_ *spawned, retErr error) {
	// Also done by the fork; the pool starts inits between forks.
	if err := prepareBranchParent(ctx, filepath.Dir(cgroupPath)); err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	cgm, err := cgmanager.New(&cgroups.Cgroup{Path: cgroupPath, Resources: &cgroups.Resources{}})
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	// The new cgroup (devices included) starts with what its parent
	// allows, and its parent's limits bound it.
	if err := cgm.Apply(-1); err != nil {
		return nil, fmt.Errorf("make cgroup %s: %w", cgroupPath, err)
	}
	defer func() {
		if retErr != nil {
			_ = cgm.Destroy()
		}
	}()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "branch-ctl"), os.NewFile(uintptr(fds[1]), "branch-ctl-init")
	defer theirs.Close()
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, err
	}
	ctl := conn.(*net.UnixConn)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		ctl.Close()
		return nil, err
	}
	defer null.Close()
	started := time.Now()
	pidfd := -1
	paths := cgm.GetPaths()
	pid, born, err := c.startIn(ctx, cgroupPath, paths, c.init, []string{"brinit"}, &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{},
		Files: []uintptr{null.Fd(), null.Fd(), null.Fd(), theirs.Fd()},
		Sys:   &syscall.SysProcAttr{Cloneflags: flags, PidFD: &pidfd},
	})
	if err != nil {
		ctl.Close()
		var pl *pidsLimit
		if errors.As(err, &pl) {
			return nil, err
		}
		return nil, fmt.Errorf("start the branch init: %w", err)
	}
	init := newFastProc("", nil)
	init.pid, init.pidfd = pid, pidfd
	c.watch(init, started)
	s := &spawned{init: init, ctl: ctl, cgroup: cgroupPath, paths: paths, flags: flags, joined: make(chan error, 1)}
	var rest []string // the hierarchies it was not born in
	for _, dir := range paths {
		if !born[dir] && !slices.Contains(rest, dir) {
			rest = append(rest, dir)
		}
	}
	if len(rest) == 0 {
		s.joined <- nil
		return s, nil
	}
	go func() {
		for _, dir := range rest {
			if err := cgroups.WriteCgroupProc(dir, pid); err != nil {
				s.joined <- fmt.Errorf("put the branch init in cgroup %s: %w", dir, err)
				return
			}
		}
		s.joined <- nil
	}()
	return s, nil
}

// waitJoined waits for the init's move into its cgroup and says how it
// went; the answer stays for later callers.
func (s *spawned) waitJoined() error {
	err := <-s.joined
	s.joined <- err
	return err
}

// joinedYet says, without waiting, whether the init's move into its
// cgroup is done, and how it went.
func (s *spawned) joinedYet() (bool, error) {
	select {
	case err := <-s.joined:
		s.joined <- err
		return true, err
	default:
		return false, nil
	}
}

// ended says whether the init has exited (killed while it waited, say by
// the sandbox's OOM killer).
func (s *spawned) ended() bool {
	select {
	case <-s.init.exited:
		return true
	default:
		return false
	}
}

// discard kills an init that will not be a branch's and removes its
// cgroup.
func (s *spawned) discard(ctx context.Context) {
	_ = s.init.Kill(ctx, uint32(unix.SIGKILL), false)
	s.ctl.Close()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_ = s.init.Wait(wctx)
	cancel()
	_ = s.waitJoined() // the move must not recreate what is removed
	if err := cgroups.RemovePaths(s.paths); err != nil {
		log.G(ctx).WithError(err).WithField("cgroup", s.cgroup).Warn("remove the cgroup of a discarded branch init")
	}
}

// rename gives a spawned init's cgroup the path a branch's would have, so
// that a pre-started init looks like any other branch's. A v1 hierarchy
// renames the cgroup; cgroup2 cannot (EPERM, also the unified hierarchy of
// a hybrid host), and there the init is moved into a new cgroup of that
// name instead. On failure, paths still name the init's cgroups, for
// discard.
func (s *spawned) rename(to string) error {
	done := map[string]string{} // co-mounted controllers share a directory
	for ctrl, dir := range s.paths {
		nd, ok := done[dir]
		if !ok {
			nd = filepath.Join(filepath.Dir(dir), filepath.Base(to))
			err := os.Rename(dir, nd)
			if errors.Is(err, unix.EPERM) {
				err = moveInto(dir, nd, s.init.Pid())
			}
			if err != nil {
				return fmt.Errorf("rename cgroup %s to %s: %w", dir, nd, err)
			}
			done[dir] = nd
		}
		s.paths[ctrl] = nd
	}
	s.cgroup = to
	return nil
}

// moveInto moves pid from the cgroup dir into a new one, nd, and removes
// dir.
func moveInto(dir, nd string, pid int) error {
	if err := os.Mkdir(nd, 0o755); err != nil {
		return err
	}
	if err := cgroups.WriteCgroupProc(nd, pid); err != nil {
		_ = unix.Rmdir(nd)
		return err
	}
	for try := 0; ; try++ {
		// The move is done; a moment may pass before the old cgroup is
		// free. One still busy after 50 ms goes with the sandbox's.
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) || try == 50 {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}

// configure has a spawned init build a branch's root and start its
// command; it returns once the branch is ready or the init said why not.
func (c *contexts) configure(ctx context.Context, sb *sandbox, n *bctx, s *spawned, rootfs string, cmdLog string) (_ *fastCtx, retErr error) {
	defer func() {
		if retErr != nil {
			s.discard(ctx)
		}
	}()
	if err := setLimits(s.paths, n.limits); err != nil {
		return nil, fmt.Errorf("branch %s: set limits: %w", n.id, err)
	}
	var prog *compiledSeccomp
	if n.spec.Linux.Seccomp != nil {
		// Compiled when the sandbox chose the init (useInit).
		var err error
		if prog, err = sb.initPath.seccomp(ctx, n.spec.Linux.Seccomp); err != nil {
			return nil, fmt.Errorf("branch %s: %w", n.id, err)
		}
	}
	plan, err := planFast(n.spec, rootfs, s.paths, prog)
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", n.id, err)
	}
	if plan.cloneFlags != s.flags {
		return nil, fmt.Errorf("branch %s: its init was started with namespaces %#x, the spec wants %#x: %w", n.id, s.flags, plan.cloneFlags, errdefs.ErrInternal)
	}
	// The init attaches a clone of the shim's rootfs mount: it may have
	// been started (its mount namespace copied) before the rootfs was
	// mounted.
	rootMnt, err := unix.OpenTree(unix.AT_FDCWD, rootfs, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("branch %s: clone its rootfs mount: %w", n.id, err)
	}
	defer unix.Close(rootMnt)
	fds := []int{rootMnt}
	conf := &plan.conf
	if s.prepped != nil {
		// An init started ahead did the early part already: if it is
		// this plan's (it is, unless the sandbox's namespaces moved), it
		// gets the rest; otherwise all of it, and drops what it made.
		if early, late, ok := splitPrep(plan.conf.ops); ok && bytes.Equal(early.Bytes(), s.prepped) {
			conf = &late
			log.G(ctx).WithField("branch", n.id).Debug("the branch's init, started ahead, made the early part of its root")
		}
	}
	if n.hasCommand {
		if err := writeProc(conf, n.spec.Process, plan.cfg, false); err != nil {
			return nil, err
		}
		conf.op("run")
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		defer null.Close()
		out, err := os.OpenFile(cmdLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("branch %s: command log: %w", n.id, err)
		}
		defer out.Close()
		fds = append(fds, int(null.Fd()), int(out.Fd()), int(out.Fd()))
	}
	if prog != nil {
		fds = append(fds, int(prog.file.Fd())) // last: seccompPlan
	}
	oob := unix.UnixRights(fds...)
	ctl := s.ctl
	// An init in its cgroups already (one started ahead) goes on from its
	// root to the command without waiting for a word: one round trip
	// less.
	joined, err := s.joinedYet()
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", n.id, err)
	}
	if joined {
		conf.op("joined")
	}
	msg := append([]byte{'C'}, conf.Bytes()...)
	if _, _, err := ctl.WriteMsgUnix(msg, oob, nil); err != nil {
		return nil, fmt.Errorf("branch %s: send its init the branch's set-up: %w", n.id, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ctl.SetReadDeadline(dl)
	} else {
		_ = ctl.SetReadDeadline(time.Now().Add(time.Minute))
	}
	if !joined {
		// The init builds the root while it is moved into its cgroup.
		if err := s.waitJoined(); err != nil {
			return nil, fmt.Errorf("branch %s: %w", n.id, err)
		}
		if err := initReply(ctl, 'R'); err != nil {
			return nil, fmt.Errorf("branch %s: %w", n.id, err)
		}
		if _, err := ctl.Write([]byte{'G'}); err != nil {
			return nil, fmt.Errorf("branch %s: start its init: %w", n.id, err)
		}
	}
	if err := initReply(ctl, 'O'); err != nil {
		if ms, herr := c.hier(); herr == nil && eagainText(err) {
			// Its fork of the command was refused: by a limit above it,
			// or by the branch's own.
			if pl := asPidsLimit([]error{err}, pidsLimits(ms, n.cgroup), 0); pl != nil {
				return nil, pl
			}
		}
		return nil, fmt.Errorf("branch %s: %w", n.id, err)
	}
	_ = ctl.SetReadDeadline(time.Time{})
	fc := &fastCtx{init: s.init, ctl: ctl, cfg: plan.cfg, byID: map[string]*fastProc{}, byPid: map[int]*fastProc{}}
	go fc.read(context.WithoutCancel(ctx))
	return fc, nil
}

// initReply reads the init's next word, which must be want (or say why
// not).
func initReply(ctl *net.UnixConn, want byte) error {
	buf := make([]byte, 2048)
	k, err := ctl.Read(buf)
	switch {
	case err != nil:
		return fmt.Errorf("its init ended before it was ready (%v): %w", err, errdefs.ErrUnknown)
	case k > 0 && buf[0] == 'F':
		return fmt.Errorf("set up: %s: %w", buf[1:k], errdefs.ErrFailedPrecondition)
	case k == 0 || buf[0] != want:
		return fmt.Errorf("unexpected reply from its init %q: %w", buf[:k], errdefs.ErrUnknown)
	}
	return nil
}

// read takes the init's reports: pids of started processes and exits.
func (fc *fastCtx) read(ctx context.Context) {
	buf := make([]byte, 512)
	for {
		k, err := fc.ctl.Read(buf)
		if err != nil || k == 0 {
			break
		}
		m := string(buf[1:k])
		switch buf[0] {
		case 'S':
			pid, _, _ := strings.Cut(m, " ")
			n, _ := strconv.Atoi(pid)
			fc.mu.Lock()
			if len(fc.waiting) == 0 {
				fc.mu.Unlock()
				log.G(ctx).Warnf("branch init reported a start nobody asked for: %q", m)
				continue
			}
			p := fc.waiting[0]
			fc.waiting = fc.waiting[1:]
			if n > 0 {
				p.nspid = n
				fc.byPid[n] = p
			}
			fc.mu.Unlock()
			p.startErr = m
			close(p.startedCh)
		case 'X':
			a, b, _ := strings.Cut(m, " ")
			pid, _ := strconv.Atoi(a)
			ws, _ := strconv.Atoi(b)
			fc.mu.Lock()
			p := fc.byPid[pid]
			delete(fc.byPid, pid)
			fc.mu.Unlock()
			if p != nil {
				p.SetExited(exitStatus(unix.WaitStatus(ws)))
			}
		}
	}
	// The init is gone, and with it every process of the branch.
	fc.mu.Lock()
	fc.closed = true
	left := fc.byPid
	fc.byPid = map[int]*fastProc{}
	waiting := fc.waiting
	fc.waiting = nil
	fc.mu.Unlock()
	for _, p := range waiting {
		p.startErr = "-1 the branch's init ended"
		close(p.startedCh)
	}
	for _, p := range left {
		p.SetExited(128 + int(unix.SIGKILL))
	}
}

func exitStatus(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// Pid is the init's pid on the host.
func (fc *fastCtx) Pid() int { return fc.init.Pid() }

// Process is an exec'd process, or the init for "".
func (fc *fastCtx) Process(id string) (process.Process, error) {
	if id == "" {
		return fc.init, nil
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	p, ok := fc.byID[id]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return p, nil
}

func (fc *fastCtx) remove(id string) {
	fc.mu.Lock()
	delete(fc.byID, id)
	fc.mu.Unlock()
}

func (fc *fastCtx) execd() []process.Process {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	var out []process.Process
	for _, p := range fc.byID {
		out = append(out, p)
	}
	return out
}

// close ends the control socket, which ends a waiting init.
func (fc *fastCtx) close() { fc.ctl.Close() }

// exec starts a process in the branch through its init.
func (fc *fastCtx) exec(ctx context.Context, id string, ps *specs.Process, stdin, stdout, stderr string) (_ process.Process, retErr error) {
	fc.mu.Lock()
	if _, dup := fc.byID[id]; dup {
		fc.mu.Unlock()
		return nil, fmt.Errorf("exec id %s: %w", id, errdefs.ErrAlreadyExists)
	}
	if fc.closed {
		fc.mu.Unlock()
		return nil, fmt.Errorf("the branch's init has ended: %w", errdefs.ErrFailedPrecondition)
	}
	p := newFastProc(id, fc)
	p.stdio = stdio.Stdio{Stdin: stdin, Stdout: stdout, Stderr: stderr, Terminal: ps.Terminal}
	fc.byID[id] = p
	fc.mu.Unlock()
	defer func() {
		if retErr != nil {
			fc.remove(id)
			p.closeIO()
		}
	}()
	var w cfgWriter
	if err := writeProc(&w, ps, fc.cfg, true); err != nil {
		return nil, err
	}
	files, err := p.openIO(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	replyTheirs := os.NewFile(uintptr(sp[1]), "reply-child")
	defer replyTheirs.Close()
	if err := unix.SetsockoptInt(sp[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(sp[0])
		return nil, err
	}
	replyFile := os.NewFile(uintptr(sp[0]), "reply")
	rc, err := net.FileConn(replyFile)
	replyFile.Close()
	if err != nil {
		return nil, err
	}
	reply := rc.(*net.UnixConn)
	defer reply.Close()
	var rights []int
	for _, f := range files {
		rights = append(rights, int(f.Fd()))
	}
	rights = append(rights, int(replyTheirs.Fd()))
	msg := append([]byte{'E'}, w.Bytes()...)

	fc.sendMu.Lock()
	fc.mu.Lock()
	fc.waiting = append(fc.waiting, p)
	fc.mu.Unlock()
	_, _, err = fc.ctl.WriteMsgUnix(msg, unix.UnixRights(rights...), nil)
	if err != nil {
		fc.mu.Lock()
		for i, q := range fc.waiting {
			if q == p {
				fc.waiting = append(fc.waiting[:i], fc.waiting[i+1:]...)
				break
			}
		}
		fc.mu.Unlock()
		fc.sendMu.Unlock()
		return nil, fmt.Errorf("ask the branch's init to start %v: %w", ps.Args, err)
	}
	fc.sendMu.Unlock()
	for _, f := range files {
		f.Close()
	}
	files = nil
	replyTheirs.Close()
	select {
	case <-p.startedCh:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if strings.HasPrefix(p.startErr, "-1") {
		return nil, fmt.Errorf("start %v: %s: %w", ps.Args, strings.TrimSpace(strings.TrimPrefix(p.startErr, "-1")), errdefs.ErrUnknown)
	}
	// The process reports its host pid, its terminal, and an exec error
	// if there is one; the socket closes when it execs.
	buf := make([]byte, 2048)
	oob := make([]byte, 256)
	for {
		k, ok, _, _, err := reply.ReadMsgUnix(buf, oob)
		if err != nil || k == 0 {
			break
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:ok])
		switch buf[0] {
		case 'P':
			for _, m := range msgs {
				if cr, err := unix.ParseUnixCredentials(&m); err == nil {
					p.setPid(int(cr.Pid))
				}
			}
		case 'T':
			for _, m := range msgs {
				if fds, err := unix.ParseUnixRights(&m); err == nil {
					for i, fd := range fds {
						if i == 0 && p.console == nil {
							p.console = os.NewFile(uintptr(fd), "pty-master")
						} else {
							unix.Close(fd)
						}
					}
				}
			}
		case 'E':
			_ = p.Wait(ctx)
			return nil, fmt.Errorf("exec in branch: %s: %w", buf[1:k], errdefs.ErrNotFound)
		}
	}
	if p.Pid() <= 0 {
		_ = p.Wait(ctx)
		return nil, fmt.Errorf("start %v: the process ended before it ran: %w", ps.Args, errdefs.ErrUnknown)
	}
	if ps.Terminal {
		if p.console == nil {
			return nil, fmt.Errorf("start %v: no terminal came back: %w", ps.Args, errdefs.ErrUnknown)
		}
		if err := p.copyConsole(ctx); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// fastProc is a process of a branch run by the init (or the init itself),
// as the shim's process code sees processes.
type fastProc struct {
	id    string
	fc    *fastCtx
	stdio stdio.Stdio

	startedCh chan struct{}
	startErr  string
	nspid     int

	mu       sync.Mutex
	pid      int
	pidfd    int
	exited   chan struct{}
	status   int
	exitedAt time.Time

	stdinW  io.WriteCloser // the shim's end of the process's stdin
	console *os.File
	ioDone  sync.WaitGroup
}

func newFastProc(id string, fc *fastCtx) *fastProc {
	return &fastProc{id: id, fc: fc, startedCh: make(chan struct{}), exited: make(chan struct{}), pidfd: -1}
}

func (p *fastProc) setPid(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pid = pid
	select {
	case <-p.exited:
		return
	default:
	}
	// The pidfd pins the process: a signal never reaches a recycled pid.
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		p.pidfd = fd
	}
}

// dupPidfd returns a pidfd of the process of its own, or -1.
func (p *fastProc) dupPidfd() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd < 0 {
		return -1
	}
	fd, err := unix.FcntlInt(uintptr(p.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

func (p *fastProc) ID() string { return p.id }

func (p *fastProc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

func (p *fastProc) ExitStatus() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

func (p *fastProc) ExitedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitedAt
}

func (p *fastProc) Stdin() io.Closer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdinW == nil {
		return nil
	}
	return p.stdinW
}

func (p *fastProc) Stdio() stdio.Stdio { return p.stdio }

func (p *fastProc) Status(context.Context) (string, error) {
	select {
	case <-p.exited:
		return "stopped", nil
	default:
		return "running", nil
	}
}

func (p *fastProc) Wait(ctx context.Context) error {
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *fastProc) Resize(ws console.WinSize) error {
	if p.console == nil {
		return fmt.Errorf("process %s has no terminal: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	return unix.IoctlSetWinsize(int(p.console.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Height, Col: ws.Width})
}

func (p *fastProc) Start(context.Context) error { return nil }

// Delete lets go of the process's stdio once its output is copied.
func (p *fastProc) Delete(context.Context) error {
	p.ioDone.Wait()
	p.closeIO()
	return nil
}

func (p *fastProc) Kill(_ context.Context, sig uint32, _ bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
	default:
	}
	var err error
	if p.pidfd >= 0 {
		err = unix.PidfdSendSignal(p.pidfd, unix.Signal(sig), nil, 0)
	} else if p.pid > 0 {
		err = unix.Kill(p.pid, unix.Signal(sig))
	} else {
		return fmt.Errorf("process %s has not started: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
	}
	return err
}

func (p *fastProc) SetExited(status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	p.status = status
	p.exitedAt = time.Now()
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
	close(p.exited)
}

func (p *fastProc) closeIO() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdinW != nil {
		p.stdinW.Close()
	}
	if p.console != nil {
		p.console.Close()
		p.console = nil
	}
}

// openIO opens the process's stdio: for a terminal, nothing (its copies run
// through the terminal's master); otherwise stdin through a pipe the shim
// feeds from the caller's FIFO (so that closing it, or the FIFO's end,
// ends the process's input), and stdout and stderr as the caller's FIFOs
// themselves, which the process writes straight into.
func (p *fastProc) openIO(ctx context.Context) ([]*os.File, error) {
	if p.stdio.Terminal {
		return nil, nil
	}
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, err
	}
	if p.stdio.Stdin != "" {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		files = append(files, r)
		p.stdinW = w
		in, err := fifo.OpenFifo(context.WithoutCancel(ctx), p.stdio.Stdin, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			w.Close()
			return fail(fmt.Errorf("open stdin %s: %w", p.stdio.Stdin, err))
		}
		go func() {
			_, _ = io.Copy(w, in)
			in.Close()
			w.Close()
		}()
	} else {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return fail(err)
		}
		files = append(files, null)
	}
	for _, path := range []string{p.stdio.Stdout, p.stdio.Stderr} {
		if path == "" {
			null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				return fail(err)
			}
			files = append(files, null)
			continue
		}
		f, err := openWriteFifo(ctx, path)
		if err != nil {
			return fail(err)
		}
		files = append(files, f)
	}
	return files, nil
}

// openWriteFifo opens the writing end of a caller's FIFO, waiting (within
// ctx) for its reader if it has none yet, in blocking mode for the process.
func openWriteFifo(ctx context.Context, path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENXIO) {
		type res struct {
			f   *os.File
			err error
		}
		ch := make(chan res, 1)
		go func() {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			ch <- res{f, err}
		}()
		select {
		case r := <-ch:
			if r.err != nil {
				return nil, fmt.Errorf("open %s: %w", path, r.err)
			}
			return r.f, nil
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.f != nil {
					r.f.Close()
				}
			}()
			return nil, fmt.Errorf("open %s: no reader: %w", path, ctx.Err())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// copyConsole copies between the caller's FIFOs and the terminal's master.
func (p *fastProc) copyConsole(ctx context.Context) error {
	if p.stdio.Stdout != "" {
		out, err := fifo.OpenFifo(context.WithoutCancel(ctx), p.stdio.Stdout, unix.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("open stdout %s: %w", p.stdio.Stdout, err)
		}
		master := p.console
		p.ioDone.Add(1)
		go func() {
			defer p.ioDone.Done()
			_, _ = io.Copy(out, master) // ends with EIO when the terminal's last user goes
			out.Close()
		}()
	}
	if p.stdio.Stdin != "" {
		in, err := fifo.OpenFifo(context.WithoutCancel(ctx), p.stdio.Stdin, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open stdin %s: %w", p.stdio.Stdin, err)
		}
		master := p.console
		p.mu.Lock()
		p.stdinW = in // closing stdin stops the copy
		p.mu.Unlock()
		go func() {
			_, _ = io.Copy(master, in)
		}()
	}
	return nil
}
