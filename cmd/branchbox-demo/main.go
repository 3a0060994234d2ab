//go:build linux

// Command branchbox-demo is the main job of the quick start: it starts a
// private containerd, the branch snapshotter and the branch runtime in a
// temporary directory, runs a sandbox holding a small project whose test
// fails, forks it into four branches that each try a different fix and run
// the test, commits the first that passes (the others are invalidated and
// their processes killed), shows the fix live in the sandbox, prints the
// tree and the timings, does best-of-N again through `branchctl serve` and
// the Python SDK, and takes everything down again.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

func main() {
	bin := flag.String("bin", daemons.BinDirFromEnv(), "directory with containerd, ctr, containerd-branch-snapshotter, containerd-shim-branch-v1, branchctl and branchctl-full")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "branchbox-demo: must run as root (it starts containerd and mounts overlays)")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
	defer stop()
	if err := run(ctx, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "branchbox-demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string) (retErr error) {
	timed := func(name string, fn func() error) error {
		start := time.Now()
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("  %-58s %8s\n", name, time.Since(start).Round(100*time.Microsecond))
		return nil
	}

	fmt.Println("branchbox demo: fork a running sandbox four ways, keep the branch whose fix passes")
	var env *daemons.Env
	if err := timed("start containerd + containerd-branch-snapshotter", func() (err error) {
		env, err = daemons.Start(ctx, daemons.Config{BinDir: bin, LogLevel: "info"})
		return err
	}); err != nil {
		return err
	}
	dir := env.Dir
	defer func() {
		err := env.Stop(context.WithoutCancel(ctx))
		mounts, _ := daemons.MountsUnder(dir)
		_, statErr := os.Stat(dir)
		fmt.Printf("cleanup: daemons stopped, %d mounts left, state directory removed: %v\n", len(mounts), os.IsNotExist(statErr))
		if err != nil && retErr == nil {
			retErr = fmt.Errorf("cleanup: %w", err)
		}
	}()
	fmt.Printf("  state directory: %s\n", env.Dir)

	archive := filepath.Join(env.Dir, "busybox.tar")
	if err := timed("build busybox OCI image from /bin/busybox", func() error {
		return ociimage.WriteBusyboxImageFile(archive)
	}); err != nil {
		return err
	}
	if err := timed("ctr images import --snapshotter branch", func() error {
		_, err := env.Ctr(ctx, "images", "import", "--snapshotter", "branch", archive)
		return err
	}); err != nil {
		return err
	}
	if err := timed("total: sandbox, fork, explore, commit, tree", func() error { return runSandbox(ctx, env, timed) }); err != nil {
		return err
	}
	fmt.Println("the same through the HTTP API, as an agent in Python would do it:")
	return runSDK(ctx, env, bin, timed)
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}
