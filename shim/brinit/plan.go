//go:build linux

package brinit

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/capability"
	"github.com/opencontainers/cgroups"
	devconfig "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The branch init's plan: a sandbox's OCI spec turned into the ops of the
// init's config (brinit.c's protocol), written once per sandbox and completed
// per branch.

// Config encodes the init's instructions: NUL-terminated strings. It
// keeps them as ops too, for SplitPrep.
type Config struct {
	bytes.Buffer
	ops [][]string
}

// Ops returns the ops written so far, each its name and arguments.
func (w *Config) Ops() [][]string { return w.ops }

// Op writes an op: its name and its arguments.
func (w *Config) Op(name string, args ...string) {
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

// WriteProc encodes a process: its command, environment, user,
// capabilities, limits and scheduling. exec is true for a process exec'd
// into the branch (runc's setns process, which takes the spec's
// execCPUAffinity), false for the branch's command (runc's init).
func WriteProc(w *Config, p *specs.Process, cfg *configs.Config, exec bool) error {
	for _, a := range p.Args {
		w.Op("arg", a)
	}
	for _, e := range p.Env {
		w.Op("env", e)
	}
	w.Op("cwd", p.Cwd)
	w.Op("user", strconv.FormatUint(uint64(p.User.UID), 10), strconv.FormatUint(uint64(p.User.GID), 10))
	for _, g := range p.User.AdditionalGids {
		w.Op("group", strconv.FormatUint(uint64(g), 10))
	}
	if p.User.Umask != nil {
		w.Op("umask", strconv.FormatUint(uint64(*p.User.Umask), 10))
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
	w.Op("caps", hex(sets[0]), hex(sets[1]), hex(sets[2]), hex(sets[3]), hex(sets[4]))
	if p.NoNewPrivileges {
		w.Op("nnp")
	}
	if p.ApparmorProfile != "" {
		// Written to the process's AppArmor exec attribute, as runc
		// does; on a host without AppArmor that fails, as it does in
		// runc.
		w.Op("apparmor", p.ApparmorProfile)
	}
	if p.Terminal {
		w.Op("term")
	}
	if cfg.OomScoreAdj != nil {
		w.Op("oom", strconv.Itoa(*cfg.OomScoreAdj))
	}
	for _, r := range p.Rlimits {
		t, ok := rlimitNumber(r.Type)
		if !ok {
			return fmt.Errorf("unknown rlimit %q: %w", r.Type, errdefs.ErrInvalidArgument)
		}
		w.Op("rlimit", strconv.Itoa(t), strconv.FormatUint(r.Soft, 10), strconv.FormatUint(r.Hard, 10))
	}
	return writeSched(w, p, exec)
}

// writeSched encodes a process's scheduler, I/O priority and CPU affinity
// as runc applies them (libcontainer's setupScheduler, setupIOPriority and
// its setns process's CPU affinity, which is reset to every CPU unless the
// spec names the final set).
func writeSched(w *Config, p *specs.Process, exec bool) error {
	if p.Scheduler != nil {
		a, err := configs.ToSchedAttr(p.Scheduler)
		if err != nil {
			return fmt.Errorf("scheduler: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		w.Op("sched", strconv.FormatUint(uint64(a.Policy), 10), strconv.FormatUint(a.Flags, 10),
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
		w.Op("ioprio", strconv.Itoa(class<<13|io.Priority))
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
		w.Op("affinity", "")
		return nil
	}
	var b []byte
	for _, word := range final {
		b = binary.NativeEndian.AppendUint64(b, uint64(word))
	}
	w.Op("affinity", hexBytes(b))
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

// Plan is what the init is told to build, and how it is cloned.
type Plan struct {
	Cfg   *configs.Config // runc's conversion of the spec
	Clone uintptr         // the namespaces the init is cloned into
	Conf  Config          // the init's config
}

// Seccomp is a seccomp program compiled for the init: its filter flags
// and its length in instructions. The program itself is handed to the
// init as the config's last descriptor.
type Seccomp struct {
	Flags uint
	Len   int
}

// NewPlan converts a branch's spec (with runc's own conversion, so that
// mount options, devices and limits mean what they mean to runc) into the
// init's instructions. cgroupPaths are the branch's cgroup directories;
// seccomp is the spec's profile compiled (nil for none).
func NewPlan(spec *specs.Spec, rootfs string, cgroupPaths map[string]string, seccomp *Seccomp) (*Plan, error) {
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
	p := &Plan{Cfg: cfg, Clone: CloneFlags(spec)}
	w := &p.Conf
	newUTS, newNet := p.Clone&unix.CLONE_NEWUTS != 0, p.Clone&unix.CLONE_NEWNET != 0
	if err := namespacesPlan(w, cfg); err != nil {
		return nil, err
	}
	mountsPlan(w, cfg, rootfs, cgroupPaths)
	w.Op("pivot")
	// The sysctls before the read-only paths (/proc/sys is one), as
	// runc writes them; in sorted order, for a plan that is the same
	// for the same spec.
	for _, k := range slices.Sorted(maps.Keys(cfg.Sysctl)) {
		w.Op("write", "/proc/sys/"+strings.ReplaceAll(k, ".", "/"), cfg.Sysctl[k])
	}
	for _, m := range cfg.MaskPaths {
		w.Op("mask", m)
	}
	for _, r := range cfg.ReadonlyPaths {
		w.Op("readonly", r)
	}
	if newUTS && cfg.Hostname != "" {
		w.Op("hostname", cfg.Hostname)
	}
	if newUTS && cfg.Domainname != "" {
		w.Op("domainname", cfg.Domainname)
	}
	if newNet {
		w.Op("lo")
	}
	if cfg.Readonlyfs {
		w.Op("rootro")
	}
	seccompPlan(w, seccomp)
	return p, nil
}

// namespacesPlan is the init's work for the spec's namespaces beyond its
// own new PID and mount namespaces: the cgroup and time namespaces it
// makes, then the namespaces it joins.
func namespacesPlan(w *Config, cfg *configs.Config) error {
	var joins []string
	for _, n := range cfg.Namespaces {
		switch n.Type {
		case configs.NEWPID, configs.NEWNS:
		case configs.NEWCGROUP:
			if n.Path == "" {
				// After the shim put the init in its cgroup.
				w.Op("cgroupns")
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
			w.Op("timens", offsets.String())
		default:
			return fmt.Errorf("namespace %s: %w", n.Type, errdefs.ErrNotImplemented)
		}
	}
	for _, j := range joins {
		w.Op("setns", j)
	}
	return nil
}

// mountsPlan is the init's work on the branch's root before it pivots
// into it: the rootfs, the spec's mounts and, on a /dev tmpfs, its
// devices and links.
func mountsPlan(w *Config, cfg *configs.Config, rootfs string, cgroupPaths map[string]string) {
	// The node's mounts become slaves of the node's in the branch's
	// namespace, unless the spec says otherwise, as runc's prepareRoot
	// makes them: a mount the node makes below a volume's directory then
	// appears in the branch as in its sandbox (shared propagations are
	// the runtime's: initdriver.Unsupported).
	// Always recursive: runc makes a non-recursive one's effect safe by
	// making the rootfs's parent private, and the init attaches the
	// rootfs below mounts that would otherwise still be the node's peers
	// (the attach would appear on the node); what else it changes goes
	// with the old root at the pivot.
	rootProp := cfg.RootPropagation | unix.MS_REC
	if cfg.RootPropagation == 0 {
		rootProp = unix.MS_SLAVE | unix.MS_REC
	}
	w.Op("root", rootfs, strconv.Itoa(rootProp))
	devTmpfs := false
	for _, m := range cfg.Mounts {
		flags := m.Flags
		switch {
		case m.Device == "bind":
			w.Op("bind", m.Source, m.Destination, strconv.Itoa(flags), boolStr(flags&unix.MS_REC != 0))
		case m.Device == "cgroup" || m.Device == "cgroup2":
			cgroupMountsPlan(w, m, cgroupPaths)
			continue
		default:
			if m.Destination == "/dev" && m.Device == "tmpfs" {
				devTmpfs = true
			}
			w.Op("mount", m.Source, m.Destination, m.Device, strconv.Itoa(flags), m.Data)
		}
		// After the mount, as runc's mountPropagate.
		for _, pf := range m.PropagationFlags {
			w.Op("propagate", m.Destination, strconv.Itoa(pf))
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
			w.Op("mknod", d.Path, strconv.FormatUint(uint64(mode), 10), strconv.FormatInt(d.Major, 10),
				strconv.FormatInt(d.Minor, 10), strconv.FormatUint(uint64(d.Uid), 10), strconv.FormatUint(uint64(d.Gid), 10))
		}
		for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}, {"pts/ptmx", "/dev/ptmx"}} {
			w.Op("symlink", l[0], l[1])
		}
	}
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
func cgroupMountsPlan(w *Config, m *configs.Mount, paths map[string]string) {
	ro := m.Flags&unix.MS_RDONLY != 0
	bindFlags := (m.Flags | unix.MS_BIND) &^ unix.MS_REC
	if cgroups.IsCgroup2UnifiedMode() {
		if p, ok := paths[""]; ok {
			w.Op("bind", p, m.Destination, strconv.Itoa(bindFlags), "0")
		}
		return
	}
	w.Op("mount", "tmpfs", m.Destination, "tmpfs", strconv.Itoa(unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV), "mode=755")
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
		w.Op("bind", dir, filepath.Join(m.Destination, name), strconv.Itoa(bindFlags), "0")
		if strings.Contains(name, ",") {
			for _, c := range strings.Split(name, ",") {
				w.Op("symlink", name, filepath.Join(m.Destination, c))
			}
		}
	}
	if ro {
		w.Op("remount", m.Destination, strconv.Itoa(unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV))
	}
}

// seccompPlan has the init install prog in every process it starts, where
// runc would (see brinit.c). The program comes as the config's last
// descriptor (configure).
func seccompPlan(w *Config, prog *Seccomp) {
	if prog == nil {
		return
	}
	w.Op("seccomp", strconv.FormatUint(uint64(prog.Flags), 10), strconv.Itoa(prog.Len))
}
