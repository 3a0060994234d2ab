//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// netnsFile is, in a branch's bundle, the network namespace of an isolated
// memory branch, bind-mounted there: CRIU restores the branch's processes
// into an existing namespace (the runtime hands it over as the one their
// dump recorded as external), so it is made before the restore rather
// than by the runtime, as an isolated branch's is otherwise.
const netnsFile = "netns"

// makeIsolatedNetns makes a new network namespace with its loopback up
// and the spec's network sysctls set (sysctl, the spec's: runc writes
// them into a container's namespace, the branch init into a branch's),
// bind-mounted at path.
func makeIsolatedNetns(path string, sysctl map[string]string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("make network namespace file: %w", err)
	}
	f.Close()
	done := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it ends with this goroutine, and
		// its namespace with it, rather than going back to the scheduler
		// in the wrong one.
		runtime.LockOSThread()
		done <- newNetnsAt(path, sysctl)
	}()
	if err := <-done; err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		return err
	}
	return nil
}

// newNetnsAt moves the calling (locked) thread into a new network
// namespace, brings its loopback up, sets the network sysctls of sysctl
// in it and bind-mounts it at path.
func newNetnsAt(path string, sysctl map[string]string) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("make network namespace: %w", err)
	}
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("keep network namespace at %s: %w", path, err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring loopback up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring loopback up: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring loopback up: %w", err)
	}
	// /proc/sys/net is the calling thread's network namespace's.
	for k, v := range sysctl {
		if !strings.HasPrefix(k, "net.") {
			continue // another namespace's: CRIU restores the IPC and UTS ones
		}
		if err := os.WriteFile("/proc/sys/"+strings.ReplaceAll(k, ".", "/"), []byte(v), 0); err != nil {
			return fmt.Errorf("set sysctl %s of the sandbox in the branch's network namespace: %w", k, err)
		}
	}
	return nil
}

// restoreWorkDir, in a branch's bundle, is the work directory of the
// runtime's restore (containerd's runc process sets it): CRIU's log, and
// the tmpfs mounts the runtime fills for CRIU (shim/ocirt/tmpfs_restore.go),
// which a runtime killed midway leaves mounted.
const restoreWorkDir = "work"

// removeBundle removes a branch's bundle, detaching the network namespace
// an isolated memory branch keeps there first (a mounted file cannot be
// removed, and the namespace would outlive the branch) and whatever a
// killed restore left mounted (else RemoveAll would empty a tmpfs the
// branch's processes may still see).
func removeBundle(ctx context.Context, bundle string) {
	detachNetns(ctx, bundle)
	if err := mount.UnmountRecursive(filepath.Join(bundle, restoreWorkDir), unix.MNT_DETACH); err != nil {
		log.G(ctx).WithError(err).WithField("bundle", bundle).Warn("unmount what a restore left in a branch bundle")
		return
	}
	if err := os.RemoveAll(bundle); err != nil {
		log.G(ctx).WithError(err).WithField("bundle", bundle).Warn("remove branch bundle")
	}
}

// detachNetns detaches the network namespace a branch's bundle keeps, if
// it keeps one.
func detachNetns(ctx context.Context, bundle string) {
	if err := unix.Unmount(filepath.Join(bundle, netnsFile), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		log.G(ctx).WithError(err).WithField("bundle", bundle).Warn("detach branch network namespace")
	}
}
