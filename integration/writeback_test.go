//go:build linux

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/internal/fstest"
)

// TestAbortNotBehindWriteback: a node whose disk holds data written but
// not yet written back (another container's build, a pulled image: 256 MB
// here), on the filesystem of the snapshotter's root. An abort, and a
// commit that kills a loser, do not write it back: a branch's overlay
// syncs the whole filesystem of its upper when its superblock ends
// (overlayfs's sync_fs), and the abort waited for that (210-280 ms instead
// of 9-12 on the developers' machine with 512 MB). Before: "the abort
// wrote 256 MB to the disk", and the commit, its loser's overlay ending
// with its init, the same. Counted on the loop device under a filesystem
// of the test's own, which nothing else writes. The committed branch's
// change is the sandbox's, and forks go on.
func TestAbortNotBehindWriteback(t *testing.T) {
	ctx, env, mnt := sandboxOnDisk(t, 2048)
	bc := func(args ...string) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: %d %q %q", args, code, out, errOut)
		}
	}
	stat := filepath.Join("/sys/block", fstest.LoopDevice(t, mnt), "stat")
	written := func() int64 {
		t.Helper()
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		n, err := strconv.ParseInt(f[6], 10, 64) // sectors written, 512 bytes each
		if err != nil {
			t.Fatal(err)
		}
		return n * 512
	}
	const dirtyMB = 256
	dirty := func(name string) {
		t.Helper()
		// What the last step left to write back (a release's sync, in
		// the background) is not this step's.
		if out, err := exec.Command("sync", "-f", mnt).CombinedOutput(); err != nil {
			t.Fatalf("sync -f: %v: %s", err, out)
		}
		if out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(mnt, name), "bs=1M", "count="+strconv.Itoa(dirtyMB)).CombinedOutput(); err != nil {
			t.Fatalf("dd: %v: %s", err, out)
		}
	}
	bc("fork", "sb", "-n", "3")
	bc("exec", "sb/1", "--", "sh", "-c", "echo kept > /kept")
	for _, b := range []string{"sb/2", "sb/3"} {
		bc("exec", b, "--", "sh", "-c", "dd if=/dev/zero of=/big bs=1M count=64 2>/dev/null")
	}
	for _, step := range []struct{ what, name string }{{"abort", "sb/2"}, {"commit", "sb/1"}} {
		dirty(step.what)
		defer os.Remove(filepath.Join(mnt, step.what))
		before := written()
		bc(step.what, step.name)
		w := written() - before
		t.Logf("the %s wrote %d MB", step.what, w>>20)
		if w > dirtyMB<<20/2 {
			t.Errorf("the %s wrote %d MB to the disk, with %d MB of the node's written but not yet written back", step.what, w>>20, dirtyMB)
		}
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/kept"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Fatalf("the committed branch's file in the sandbox: %q %v", out, err)
	}
	bc("fork", "sb")
	bc("abort", "sb/4")
}
