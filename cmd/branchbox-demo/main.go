//go:build linux

// Command branchbox-demo is the main job of the quick start: it starts a
// private containerd and the branch snapshotter in a temporary directory,
// imports a locally built image into the branch snapshotter, runs a
// container on it that writes to its rootfs, shows where the write landed,
// and takes everything down again.
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

	"github.com/branchbox/branchbox/integration/harness"
)

func main() {
	bin := flag.String("bin", harness.BinDirFromEnv(), "directory with containerd, ctr, containerd-shim-runc-v2 and containerd-branch-snapshotter")
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

	fmt.Println("branchbox demo: a private containerd with the branch snapshotter")
	var env *harness.Env
	if err := timed("start containerd + containerd-branch-snapshotter", func() (err error) {
		env, err = harness.Start(ctx, harness.Config{BinDir: bin})
		return err
	}); err != nil {
		return err
	}
	dir := env.Dir
	defer func() {
		err := env.Stop(context.WithoutCancel(ctx))
		mounts, _ := harness.MountsUnder(dir)
		_, statErr := os.Stat(dir)
		fmt.Printf("cleanup: daemons stopped, %d mounts left, state directory removed: %v\n", len(mounts), os.IsNotExist(statErr))
		if err != nil && retErr == nil {
			retErr = fmt.Errorf("cleanup: %w", err)
		}
	}()
	fmt.Printf("  state directory: %s\n", env.Dir)

	archive := filepath.Join(env.Dir, "busybox.tar")
	if err := timed("build busybox OCI image from /bin/busybox", func() error {
		return harness.WriteBusyboxImageFile(archive)
	}); err != nil {
		return err
	}
	if err := timed("ctr images import --snapshotter branch", func() error {
		_, err := env.Ctr(ctx, "images", "import", "--snapshotter", "branch", archive)
		return err
	}); err != nil {
		return err
	}
	var out string
	script := "echo 'hello from a container on the branch snapshotter' > /greeting && dd if=/dev/zero of=/data bs=1024 count=256 2>/dev/null && cat /greeting"
	if err := timed("ctr run --snapshotter branch (write a file, exit)", func() (err error) {
		out, err = env.Ctr(ctx, "run", "--snapshotter", "branch", harness.ImageRef, "demo", "sh", "-c", script)
		return err
	}); err != nil {
		return err
	}
	fmt.Printf("  container said: %s\n", strings.TrimSpace(out))

	uppers, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "snapshots", "*", "fs", "greeting"))
	for _, u := range uppers {
		rel, _ := filepath.Rel(env.Dir, u)
		fmt.Printf("  the write landed in the container's upper layer: $STATE/%s\n", rel)
	}
	if out, err := env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "usage", "demo"); err == nil {
		fmt.Printf("  ctr snapshots --snapshotter branch usage demo:\n%s", indent(out))
	}
	if out, err := env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "tree"); err == nil {
		fmt.Printf("  ctr snapshots --snapshotter branch tree:\n%s", indent(out))
	}

	if err := timed("remove container and image", func() error {
		if _, err := env.Ctr(ctx, "containers", "delete", "demo"); err != nil {
			return err
		}
		_, err := env.Ctr(ctx, "images", "rm", "--sync", harness.ImageRef)
		return err
	}); err != nil {
		return err
	}
	left, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "snapshots", "*"))
	fmt.Printf("  snapshot directories left after removal: %d\n", len(left))
	if len(left) != 0 {
		return fmt.Errorf("snapshot directories left behind: %v", left)
	}
	return nil
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}
