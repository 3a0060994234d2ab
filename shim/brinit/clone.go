//go:build linux

package brinit

import (
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// How a branch init is cloned, known before its plan: the pool starts
// inits ahead with it, and a branch's start picks or spawns its init by
// it, before the init's cgroup (which the plan needs) is known.

// CloneFlags are the namespaces a branch init is cloned into: new PID and
// mount namespaces, and the spec's new IPC, UTS and network namespaces (a
// cgroup namespace is made once the init is in its cgroup; namespaces with
// a path are joined).
func CloneFlags(spec *specs.Spec) uintptr {
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
