//go:build linux

package initdriver

// The branch init (package brinit: its C and its plan; built as
// cmd/containerd-shim-branch-v1/init): where it is and which specs it
// takes; the runtime runs the branches of the others. Its driver is
// driver.go, its start start.go, a branch it runs branch.go, its
// processes process.go, its pool of inits started ahead pool.go and
// refill.go.

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// InitBinary is the branch init (cmd/containerd-shim-branch-v1/init, package brinit),
// looked for beside the shim. With it, a branch starts without the runtime:
// the shim makes the cgroup and starts the init in the branch's new
// namespaces, and the init, which is C run before any Go runtime starts,
// builds the root and runs the branch's processes on the shim's word. That
// spares two runs of a Go binary and libcontainer's set-up per branch.
const InitBinary = "containerd-shim-branch-v1-init"

// FindBinary is the init binary beside self, or "" if it is not installed.
func FindBinary(self string) string {
	p := filepath.Join(filepath.Dir(self), InitBinary)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return p
	}
	return ""
}

// Unsupported says why a branch of this spec must be run by the
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

// sharedPropagation says whether o is a propagation that makes mounts
// shared or unbindable (a mount option, or the spec's rootfs
// propagation), which the init does not apply.
func sharedPropagation(o string) bool {
	switch o {
	case "shared", "rshared", "unbindable", "runbindable":
		return true
	}
	return false
}

func Unsupported(s *specs.Spec) string {
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
	if sharedPropagation(l.RootfsPropagation) {
		return "rootfs propagation " + l.RootfsPropagation
	}
	for _, m := range s.Mounts {
		if len(m.UIDMappings) > 0 || len(m.GIDMappings) > 0 {
			return "id-mapped mount"
		}
		for _, o := range m.Options {
			if sharedPropagation(o) {
				// A branch's mounts made shared would need its rootfs's
				// parent made private and the rest of runc's care for a
				// shared root: the runtime's.
				return "mount propagation " + o
			}
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

// seccompNotifies says whether a profile hands syscalls to a user-space
// agent, which the runtime connects to the filter's listener.
func seccompNotifies(s *specs.LinuxSeccomp) bool {
	if s.ListenerPath != "" || s.DefaultAction == specs.ActNotify {
		return true
	}
	for _, c := range s.Syscalls {
		if c.Action == specs.ActNotify {
			return true
		}
	}
	return false
}
