//go:build linux

// Command branchctl forks a running sandbox (a container on the runtime
// io.containerd.branch.v1 and the snapshotter branch) into branches,
// runs commands in them, and commits or aborts them (internal/branchctl).
// It links only what the everyday commands need, so that it starts in a
// few milliseconds: for the heavy ones (serve, mcp, push, pull, save, load)
// it execs branchctl-full, found beside it or on PATH.
package main

import (
	"context"
	"os"

	"github.com/branchbox/branchbox/internal/branchctl"
)

func main() {
	os.Exit(branchctl.Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, nil))
}
