//go:build linux

package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/internal/cgroupfit"
)

// Network modes of a branch.
const (
	NetShared   = "shared"
	NetIsolated = "isolated"
)

// Seal modes of a branch with children.
const (
	SealReadOnly = "ro"
	SealFreeze   = "freeze"
)

func ReadSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read spec of %s: %w", bundle, err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decode spec of %s: %v: %w", bundle, err, errdefs.ErrInvalidArgument)
	}
	return &s, nil
}

func writeSpec(bundle string, s *specs.Spec) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}

// joinNS are the parent's namespaces a branch joins, as /proc/PID/ns paths
// of its init: its network namespace ("" for a new loopback-only one) and
// its user namespace (joined when the parent's spec made one of its own).
type joinNS struct{ net, user string }

// branchSpec derives a branch's spec from its parent's: the same
// process, mounts, capabilities and limits, but its own rootfs (the
// branch's overlay, mounted at <bundle>/rootfs), its own PID and mount
// namespaces, a cgroup nested under the parent's, and the parent's network
// namespace (or a new loopback-only one). A parent in a user namespace of
// its own has its branches join it: they keep its mapping (their rootfs is
// id-mapped by the snapshotter for it), and a network namespace it owns
// is theirs to mount sysfs for.
//
// The parent's spec is copied only where the branch's differs (the
// process, the linux section and its resources); the rest is shared, so
// neither spec may be changed in place afterwards. A copy through JSON
// cost a quarter of a millisecond of every branch's start.
func branchSpec(parent *specs.Spec, cgroupPath string, join joinNS, req *shimv1.ForkRequest) (*specs.Spec, error) {
	if parent.Linux == nil || parent.Process == nil {
		return nil, fmt.Errorf("sandbox spec has no linux section or process: %w", errdefs.ErrInvalidArgument)
	}
	s := *parent
	process, linux := *parent.Process, *parent.Linux
	s.Process, s.Linux = &process, &linux
	if r := parent.Linux.Resources; r != nil {
		res := *r
		s.Linux.Resources = &res
	}
	readonly := s.Root != nil && s.Root.Readonly
	s.Root = &specs.Root{Path: "rootfs", Readonly: readonly}
	s.Hooks = nil // the sandbox's hooks (networking and the like) ran for it already
	s.Annotations = nil
	s.Process.Terminal = false
	s.Process.ConsoleSize = nil
	if len(req.Args) > 0 {
		s.Process.Args = req.Args
	}
	s.Linux.CgroupsPath = cgroupPath
	var ns []specs.LinuxNamespace
	for _, n := range s.Linux.Namespaces {
		switch n.Type {
		case specs.PIDNamespace, specs.MountNamespace, specs.NetworkNamespace:
			continue
		case specs.UserNamespace:
			if n.Path == "" {
				if join.user == "" {
					return nil, fmt.Errorf("the parent's user namespace has no path to join: %w", errdefs.ErrFailedPrecondition)
				}
				n.Path = join.user
			}
		}
		ns = append(ns, n)
	}
	ns = append(ns, specs.LinuxNamespace{Type: specs.PIDNamespace}, specs.LinuxNamespace{Type: specs.MountNamespace})
	// A new network namespace gets only loopback (libcontainer brings it up).
	ns = append(ns, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: join.net})
	s.Linux.Namespaces = ns
	if l := req.Limits; l != nil {
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		applyLimits(s.Linux.Resources, l)
	}
	return &s, nil
}

// restoredUserNS makes a memory branch's spec ask for a user namespace of
// its own, with the parent's mappings, in place of joining the parent's:
// CRIU makes it from the image's, and a task born in it could not join the
// parent's (a sibling it holds no capability over). Its processes run with
// the same ids, on the host as in the namespace.
func restoredUserNS(s *specs.Spec) {
	for i, n := range s.Linux.Namespaces {
		if n.Type == specs.UserNamespace {
			s.Linux.Namespaces[i].Path = ""
		}
	}
}

// sharedWithUserNS names a namespace (ipc, uts) that a spec in a user
// namespace joins by path, or is "": a pod's container with hostUsers:
// false joins its pod's, owned by the pod's user namespace.
func sharedWithUserNS(s *specs.Spec) string {
	if s == nil || s.Linux == nil {
		return ""
	}
	user, joined := false, ""
	for _, n := range s.Linux.Namespaces {
		switch n.Type {
		case specs.UserNamespace:
			user = true
		case specs.IPCNamespace, specs.UTSNamespace, specs.CgroupNamespace:
			if n.Path != "" && joined == "" {
				joined = string(n.Type)
			}
		}
	}
	if !user {
		return ""
	}
	return joined
}

// sharedPidNS says whose PID namespace a spec's processes run in when it
// is not one of their own: "the host's" without a PID namespace, "one it
// joins" with a path (another container's, a pod's with
// shareProcessNamespace), "" for a namespace of their own.
func sharedPidNS(s *specs.Spec) string {
	if s == nil || s.Linux == nil {
		return ""
	}
	for _, n := range s.Linux.Namespaces {
		if n.Type == specs.PIDNamespace {
			if n.Path != "" {
				return "one it joins (another container's, or a pod's that shares its process namespace)"
			}
			return ""
		}
	}
	return "the host's"
}

// imageForUserNS gives a memory image to the root of the user namespace a
// spec asks for, if it asks for one: CRIU's restored root task opens the
// image's files from inside that namespace, first with the host root's ids
// (before its own are set) and then as the namespace's root (a host uid of
// its range), which holds no right over the host root's files ("Unable to
// open tty-info.img: Permission denied"). So each file is owned by that
// uid and the host root's group, readable by both and by no one else.
// They are reached through the image directory CRIU holds open, not
// through the directories above it.
func imageForUserNS(dir string, s *specs.Spec) error {
	if s == nil || s.Linux == nil {
		return nil
	}
	user := false
	for _, n := range s.Linux.Namespaces {
		user = user || n.Type == specs.UserNamespace
	}
	uid := -1
	for _, m := range s.Linux.UIDMappings {
		if m.ContainerID == 0 {
			uid = int(m.HostID)
		}
	}
	if !user || uid < 0 {
		return nil
	}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&os.ModeSymlink != 0 {
			return nil
		}
		mode := os.FileMode(0o640)
		if d.IsDir() {
			mode = 0o750
		}
		if err := os.Lchown(p, uid, 0); err != nil {
			return err
		}
		return os.Chmod(p, mode)
	})
	if err != nil {
		return fmt.Errorf("give the memory image to the user namespace's root (uid %d): %w", uid, err)
	}
	return nil
}

// applyLimits sets the limits given at fork on a branch's resources.
func applyLimits(r *specs.LinuxResources, l *shimv1.Limits) {
	if l.Memory > 0 {
		var mem specs.LinuxMemory
		if r.Memory != nil {
			mem = *r.Memory
		}
		m := l.Memory
		mem.Limit, mem.Swap = &m, nil
		r.Memory = &mem
	}
	if l.Cpus > 0 {
		var cpu specs.LinuxCPU
		if r.CPU != nil {
			cpu = *r.CPU
		}
		period := uint64(100000)
		quota := int64(l.Cpus * float64(period))
		cpu.Period, cpu.Quota = &period, &quota
		r.CPU = &cpu
	}
	if l.Pids > 0 {
		p := l.Pids
		r.Pids = &specs.LinuxPids{Limit: &p}
	}
}

// runtimeSpec is the spec the runtime runs a branch from (a memory
// branch, or one the branch init does not take): the branch's, without
// the limits and cpuset it took from its parent's spec, as the branch
// init runs one (shim/cgroup.SetLimits writes only the fork's). Its
// cgroup is nested in its parent's, which bounds it with the parent's
// limits as they are now; the parent's spec has them as they were at its
// create, before any update (nerdctl update, a pod's resize), and on
// cgroup v1 the kernel refuses a child a cpuset or a quota beyond its
// parent's: such a fork failed after an update narrowed the sandbox's.
func runtimeSpec(s *specs.Spec, l *shimv1.Limits) *specs.Spec {
	if s.Linux == nil || s.Linux.Resources == nil {
		return s
	}
	out, linux, res := *s, *s.Linux, *s.Linux.Resources
	out.Linux, linux.Resources = &linux, &res
	if res.Memory != nil {
		mem := *res.Memory
		mem.Limit, mem.Swap, mem.Reservation = nil, nil, nil
		res.Memory = &mem
	}
	if res.CPU != nil {
		cpu := *res.CPU
		cpu.Quota, cpu.Period, cpu.Cpus, cpu.Mems = nil, nil, "", ""
		res.CPU = &cpu
	}
	res.Pids = nil
	if l != nil {
		if over, _ := cgroupfit.CPUsAboveAncestors(linux.CgroupsPath, l.Cpus); over {
			// As SetLimits leaves it: bounded by the ancestor's.
			l = &shimv1.Limits{Memory: l.Memory, Pids: l.Pids}
		}
		applyLimits(&res, l)
	}
	return &out
}
