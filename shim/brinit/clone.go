//go:build linux

package brinit

import (
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// How a branch init is cloned, known before its plan: the pool starts
// inits ahead with it, and a branch's start picks or spawns its init by
// it, before the init's cgroup (which the plan needs) is known.

// CloneFlags are the namespaces a branch init is cloned into: a new PID
// namespace and the spec's new IPC, UTS and network namespaces (a cgroup
// namespace is made once the init is in its cgroup; namespaces with a path
// are joined). Not a mount namespace: the init makes its own (brinit.c,
// own_mntns). An init cloned into one would hold a copy of every mount of
// the node from the moment it was started ahead of a fork, for as long as
// it waits: where the node's mounts are private (no systemd as PID 1), an
// unmount on the node does not reach that copy, which keeps other
// containers' rootfs and the layers of aborted branches alive, their
// space not freed.
func CloneFlags(spec *specs.Spec) uintptr {
	f := uintptr(unix.CLONE_NEWPID)
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
