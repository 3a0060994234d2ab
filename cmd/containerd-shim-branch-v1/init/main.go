//go:build linux

// Command containerd-shim-branch-v1-init is the init of a branch context:
// the shim starts it in the branch's new namespaces, it builds the
// branch's root (mounts, devices, pivot_root) from the shim's instructions,
// then starts the branch's processes as the shim asks. All of it is C that
// runs from a constructor, before the Go runtime would start, and never
// returns: a branch start then costs no run of the Go runtime and no
// libcontainer set-up (see brinit.c for the protocol).
package main

/*
#cgo CFLAGS: -Wall -O2
extern void brinit(void);
__attribute__((constructor)) static void brinit_ctor(void) { brinit(); }
*/
import "C"

func main() {}
