//go:build linux

// Package brinit is the branch init: brinit.c, the C that runs in a new
// branch's namespaces before the Go runtime would start (a constructor)
// and builds its root and starts its processes, and its Go half, which
// turns a branch's OCI spec into the init's instructions (Plan, Config)
// for the shim to send, as runc keeps nsexec.c beside the Go that drives
// it. The init binary (cmd/containerd-shim-branch-v1/init) only imports
// this package; the shim imports it for the Go half, and the constructor
// there returns at once: it takes over only a process started as the init
// (argv ["brinit"]; see brinit.c for the protocol).
package brinit

/*
#cgo CFLAGS: -Wall -O2
extern void brinit(int argc, char **argv);
// glibc hands a constructor the program's arguments.
__attribute__((constructor)) static void brinit_ctor(int argc, char **argv, char **envp) { brinit(argc, argv); }
*/
import "C"
