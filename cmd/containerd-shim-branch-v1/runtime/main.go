//go:build linux

// Command containerd-shim-branch-v1-runtime is the runtime half of
// containerd-shim-branch-v1 alone: the runc-compatible command line (package
// ocirt) and libcontainer's container init, without containerd's shim code.
// The shim runs it for branches when it is installed beside the shim:
// each branch start executes the runtime twice (create, then libcontainer's
// re-exec as the init), and this binary starts in about half the time of
// the shim binary (fewer pages to fault in, far fewer package initialisers).
package main

import (
	"os"

	// Registers the cgroup device-rule manager, as runc's main does.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/runc/libcontainer"
	// nsexec runs in C before the Go runtime starts when this binary is
	// re-executed as a container's init (or to join its namespaces).
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

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
	os.Exit(ocirt.Main(os.Args))
}
