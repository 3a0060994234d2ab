//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
)

// TestHostUnmountNotPinned: a mount the node unmounts is gone, and its
// filesystem freed, even where the host's mounts are private (no systemd
// as PID 1: containers in containers, CI machines, this one). Before, the
// inits a sandbox starts ahead of its forks were cloned into a mount
// namespace of their own at once: a private copy of every mount of the
// node at that moment, held for as long as the init waited, which kept
// other containers' rootfs and the layers of aborted branches (their
// space: TestFullDisk failed so in CI) alive after the node unmounted
// them. A mount made before the sandbox's pool, seen by an init waiting in
// it, is unmounted on the host: no process of the sandbox still has it,
// and a fork after it still works.
func TestHostUnmountNotPinned(t *testing.T) {
	dir := t.TempDir()
	source := fmt.Sprintf("bbx-pin-%d", time.Now().UnixNano())
	if err := unix.Mount(source, dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	}()
	ctx, env, sc := sandboxCtxEnv(t)
	cg := "/" + env.Namespace + "/sb"
	// The client's dial starts the sandbox's pool: wait for an init of it,
	// which sees the mount, in the sandbox's cgroup and outside its
	// container.
	var waiting string
	waitFor(t, func() bool {
		waiting = seeing(t, cg, source)
		return waiting != ""
	})
	t.Logf("init %s waits with the mount in view", waiting)
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if pid := seeing(t, cg, source); pid != "" {
		b, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		t.Fatalf("process %s (%q) of the sandbox still has the mount the host unmounted", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
	}
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	if got := mustRun(t, ctx, sc, kids[0].ID, "cat", "/state"); got != "before\n" {
		t.Fatalf("the branch forked after the unmount reads %q", got)
	}
	if got := mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "grep -c "+source+" /proc/self/mountinfo; true"); got != "0\n" {
		t.Fatalf("the branch has the host's mount: %s", got)
	}
}

// seeing returns a process in cgroup cg (or below) whose mount namespace
// has a mount of source, or "".
func seeing(t *testing.T, cg, source string) string {
	for _, pid := range cgroupProcs(t, cg) {
		b, err := os.ReadFile(filepath.Join("/proc", pid, "mountinfo"))
		if err == nil && bytes.Contains(b, []byte(" "+source+" ")) {
			return pid
		}
	}
	return ""
}
