//go:build linux

// Command containerd-branch-snapshotter serves the branch snapshotter to
// containerd as a proxy snapshotter plugin over gRPC on a unix socket:
//
//	[proxy_plugins.branch]
//	  type = "snapshot"
//	  address = "/run/containerd-branch-snapshotter/snapshotter.sock"
//	  exports = { root = "/var/lib/containerd-branch-snapshotter" }
//
// The branch API is served on that socket too, and over ttrpc on the same
// path with ".ttrpc" appended, which the shims use.
package main

import (
	"github.com/branchbox/branchbox/branch"

	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/snapshotter"
	"github.com/branchbox/branchbox/snapshotter/server"
)

const (
	defaultRoot = "/var/lib/containerd-branch-snapshotter"
	// faultEnv names a fault point (snapshotter.Fault*) at which the daemon
	// kills itself with SIGKILL: the crash-safety tests arm it.
	faultEnv = "BRANCHBOX_FAULT_POINT"
)

func main() {
	var (
		root     = flag.String("root", defaultRoot, "directory holding snapshots and metadata")
		address  = flag.String("address", branch.DefaultSnapshotterAddress, "unix socket to serve the snapshots API on")
		logLevel = flag.String("log-level", "info", "log level: trace, debug, info, warn, error")
		reap     = flag.Duration("reap-interval", 5*time.Minute, "how often to remove orphaned snapshot and branch state (0: only at start)")
		slowSeal = flag.Duration("seal-mounts-after", 0, fmt.Sprintf("seal a forked parent mount by mount once its superblock's seal took longer than this, as after its files were looked up (0: always the superblock's; %s suggested; docs/seal.md)", snapshotter.SlowSuperblockSeal))
	)
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "containerd-branch-snapshotter: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if err := log.SetLevel(*logLevel); err != nil {
		fmt.Fprintf(os.Stderr, "containerd-branch-snapshotter: --log-level %q: %v\n", *logLevel, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	if *reap < 0 {
		fmt.Fprintf(os.Stderr, "containerd-branch-snapshotter: --reap-interval %s is negative\n", *reap)
		os.Exit(2)
	}
	if *slowSeal < 0 {
		fmt.Fprintf(os.Stderr, "containerd-branch-snapshotter: --seal-mounts-after %s is negative\n", *slowSeal)
		os.Exit(2)
	}
	if err := server.Serve(ctx, server.Config{Root: *root, Address: *address, ReapInterval: *reap, FaultPoint: os.Getenv(faultEnv), SlowSeal: slowSeal}); err != nil {
		log.G(ctx).WithError(err).Error("containerd-branch-snapshotter failed")
		fmt.Fprintf(os.Stderr, "containerd-branch-snapshotter: %v\n", err)
		os.Exit(1)
	}
}
