//go:build linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
)

// loopExt4 mounts a new ext4 filesystem of sizeMB on a loop device and
// returns its mount point; the test's clean-up unmounts it.
func loopExt4(t *testing.T, sizeMB int) string {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	run("truncate", "-s", fmt.Sprintf("%dM", sizeMB), img)
	run("mkfs.ext4", "-q", "-F", "-m", "0", img)
	if err := os.Mkdir(mnt, 0o711); err != nil {
		t.Fatal(err)
	}
	run("mount", "-o", "loop", img, mnt)
	t.Cleanup(func() {
		// Detached overlays let go of it a moment after.
		for i := 0; ; i++ {
			out, err := exec.Command("umount", mnt).CombinedOutput()
			if err == nil {
				return
			}
			if i == 100 {
				t.Errorf("umount %s: %v: %s", mnt, err, out)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return mnt
}

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
	mnt := loopExt4(t, 256)
	ctx, env, _ := shimEnvWith(t, daemons.Config{Dir: filepath.Join(mnt, "env")})
	runSandbox(t, ctx, env, "docker.io/branchbox/busybox:test", "sleep", "100000")
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
