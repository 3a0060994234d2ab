//go:build linux

package integration

import (
	"context"
	"strings"
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
