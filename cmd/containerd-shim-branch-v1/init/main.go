//go:build linux

// Command containerd-shim-branch-v1-init is the init of a branch:
// the shim starts it in the branch's new namespaces, it builds the
// branch's root (mounts, devices, pivot_root) from the shim's instructions,
// then starts the branch's processes as the shim asks. All of it is C
// (package brinit) that runs from a constructor, before the Go runtime
// would start, and never returns: a branch start then costs no run of the
// Go runtime and no libcontainer set-up.
package main

import (
	"fmt"
	"os"

	_ "github.com/branchbox/branchbox/shim/brinit"
)

// main runs only when the init was not started by the shim.
func main() {
	fmt.Fprintln(os.Stderr, "containerd-shim-branch-v1-init is the init of a branch; only the shim starts it")
	os.Exit(2)
}
