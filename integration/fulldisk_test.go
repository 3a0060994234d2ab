//go:build linux

package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fstest"
)

// TestFullDisk: a node whose containerd and snapshotter directories are on
// a filesystem (256 MB of ext4) that a branch's writes fill, space and
// inodes, as an agent's runaway branch fills a node's /var/lib. What
// users do next works, through branchctl: a fork and a checkpoint are
// refused with resource exhausted, saying where to make room and naming
// no directory of the snapshotter's; the branch that filled the disk is
// aborted (before: "commit branch metadata: write .../branches.db: no
// space left on device", and the branch stayed); the other branch is
// committed at once after (before: refused, the aborted layer still on
// disk), its change in the sandbox; and forks work again.
func TestFullDisk(t *testing.T) {
	ctx, env, _ := sandboxOnDisk(t, 256)
	bc := func(args ...string) (string, string) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: %d %q %q", args, code, out, errOut)
		}
		return out, errOut
	}
	refused := func(what string, args ...string) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code == 0 || !strings.Contains(errOut, "resource exhausted") || !strings.Contains(errOut, "no room for") ||
			strings.Contains(errOut, env.SnapshotterRoot+"/") {
			t.Fatalf("%s on a full disk: %d %q %q; want resource exhausted, no room, no directory of the snapshotter's", what, code, out, errOut)
		}
	}
	bc("fork", "sb", "-n", "2")
	bc("exec", "sb/1", "--", "sh", "-c", "echo won > /winner")
	out, errOut := bc("exec", "sb/2", "--", "sh", "-c", "dd if=/dev/zero of=/big bs=1M; i=0; while touch /f$i 2>/dev/null; do i=$((i+1)); done; echo $i files")
	if !strings.Contains(errOut, "No space left on device") {
		t.Fatalf("filling the disk: %q %q", out, errOut)
	}
	refused("fork", "fork", "sb/1")
	refused("checkpoint", "checkpoint", "sb", "c1")
	bc("abort", "sb/2")
	bc("commit", "sb/1")
	if out, err := execIn(ctx, env, "sb", "cat", "/winner"); err != nil || strings.TrimSpace(out) != "won" {
		t.Fatalf("the winner's file in the sandbox: %q %v", out, err)
	}
	bc("fork", "sb")
	bc("checkpoint", "sb", "c1")
}

// sandboxOnDisk runs sandbox "sb" (busybox, sleeping) in an env whose
// containerd and snapshotter directories are on an ext4 of sizeMB of its
// own (a loop device), as a node's /var/lib, and returns where that
// filesystem is mounted.
func sandboxOnDisk(t *testing.T, sizeMB int) (context.Context, *daemons.Env, string) {
	t.Helper()
	requireRoot(t)
	mnt := fstest.LoopExt4(t, sizeMB)
	// What a node keeps on disk; the rest (sockets, containerd's state,
	// logs) is in a directory of its own, as in a node's /run.
	ctx, env, _ := shimEnvWith(t, daemons.Config{DiskDir: mnt})
	runSandbox(t, ctx, env, "docker.io/branchbox/busybox:test", "sleep", "100000")
	return ctx, env, mnt
}

// TestFullStateDir: containerd's state directory (a node's /run, a tmpfs
// sized by its memory) is full when a sandbox whose branches the runtime
// starts (it has CAP_SYS_PTRACE) forks. The fork is refused with resource
// exhausted, in one line saying where to make room and naming no host
// path (a sandbox asking through its socket is not shown them); before,
// each branch's start said "write spec: write <its bundle>/config.json:
// no space left on device", of no kind. Nothing of the fork is left, and
// once room is made the sandbox forks.
func TestFullStateDir(t *testing.T) {
	requireRoot(t)
	run, err := os.MkdirTemp("", "bbxs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	fstest.Tmpfs(t, run, "size=32m,mode=0711")
	ctx, env, _ := shimEnvWith(t, daemons.Config{Dir: filepath.Join(run, filepath.Base(run)), DiskDir: t.TempDir()})
	runSandboxWith(t, ctx, env, []string{"--cap-add", "CAP_SYS_PTRACE"}, "docker.io/branchbox/busybox:test", "sleep", "100000")

	filler := filepath.Join(run, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for err == nil {
		_, err = f.Write(chunk)
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the state directory: %v", err)
	}
	out, errOut, code := branchctl(t, ctx, env, "", "fork", "sb", "-n", "2")
	if code == 0 || !strings.Contains(errOut, "resource exhausted") || !strings.Contains(errOut, "no room for its branches' bundles") ||
		strings.Contains(errOut, run) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("fork with containerd's state directory full: %d %q %q; want resource exhausted, no room, one line, no host path", code, out, errOut)
	}
	if live := liveInSnapshotter(t, ctx, env, "sb"); len(live) != 0 {
		t.Errorf("branches live in the snapshotter after the refused fork: %v", live)
	}
	if left, _ := os.ReadDir(filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb", "branches")); len(left) != 0 {
		t.Errorf("bundles left of the refused fork: %d", len(left))
	}
	if dirs, pids := branchCgroupsOf(env.Namespace, "sb"); len(dirs) != 0 || len(pids) != 0 {
		t.Errorf("branch cgroups left: %v (processes %v)", dirs, pids)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := branchctl(t, ctx, env, "", "fork", "sb", "-n", "2"); code != 0 {
		t.Fatalf("fork once room is made: %d %q %q", code, out, errOut)
	}
}
