//go:build linux

// Command containerd-shim-branch-v1 is the containerd runtime
// io.containerd.branch.v1. The same binary is three things, told apart by
// its arguments: libcontainer's container init ("init", re-executed by
// libcontainer itself), the runc-compatible runtime the task service drives
// (argv starting with --root), and the containerd shim (everything else).
package main

import (
	"context"
	"os"

	cshim "github.com/containerd/containerd/v2/pkg/shim"
	// Registers the cgroup device-rule manager, as runc's main does;
	// without it libcontainer cannot apply the spec's device rules.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/runc/libcontainer"
	// nsexec runs in C before the Go runtime starts when this binary is
	// re-executed as a container's init (or to join its namespaces).
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	"github.com/branchbox/branchbox/shim"
	"github.com/branchbox/branchbox/shim/ocirt"
)

func init() {
	// libcontainer's re-exec must be handled before anything else runs:
	// Init never returns.
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
}

func main() {
	if ocirt.IsInvocation(os.Args) {
		os.Exit(ocirt.Main(os.Args))
	}
	shim.Register()
	cshim.Run(context.Background(), shim.NewManager())
}
