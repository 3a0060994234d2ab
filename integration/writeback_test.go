//go:build linux

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fstest"
)

// TestAbortNotBehindWriteback: a node whose disk holds data written but
// not yet written back (another container's build, a pulled image: 384 MB
// here), on the filesystem of the snapshotter's root. An abort and a
// commit do not write it back: the overlay of a branch that ends syncs
// the whole filesystem of its upper when its superblock goes (overlayfs's
// sync_fs), and the abort waited for that (210-280 ms instead of 9-12 on
// the developers' machine with 512 MB; before: "the abort wrote 384 MB to
// the disk"). Counted on the loop device under a filesystem of the test's
// own, which nothing else writes. The space the aborted branch held is
// free for a commit at once after (TestFullDisk: the release lets go of
// it), and its rootfs mount goes.
func TestAbortNotBehindWriteback(t *testing.T) {
	requireRoot(t)
	mnt := fstest.LoopExt4(t, 1024)
	dir, err := os.MkdirTemp(mnt, "env-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, env, _ := shimEnvWith(t, daemons.Config{Dir: dir})
	runSandbox(t, ctx, env, "docker.io/branchbox/busybox:test", "sleep", "100000")
	bc := func(args ...string) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: %d %q %q", args, code, out, errOut)
		}
	}
	dev, err := exec.Command("findmnt", "-no", "SOURCE", mnt).Output()
	if err != nil {
		t.Fatal(err)
	}
	stat := filepath.Join("/sys/block", filepath.Base(strings.TrimSpace(string(dev))), "stat")
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
	const dirtyMB = 384
	dirty := func(name string) {
		t.Helper()
		if out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(mnt, name), "bs=1M", "count="+strconv.Itoa(dirtyMB)).CombinedOutput(); err != nil {
			t.Fatalf("dd: %v: %s", err, out)
		}
	}
	bc("fork", "sb", "-n", "2")
	bc("exec", "sb/1", "--", "sh", "-c", "echo kept > /kept")
	bc("exec", "sb/2", "--", "sh", "-c", "dd if=/dev/zero of=/big bs=1M count=64 2>/dev/null")
	for _, step := range []struct{ what, name string }{{"abort", "sb/2"}, {"commit", "sb/1"}} {
		dirty(step.what)
		before := written()
		bc(step.what, step.name)
		if w := written() - before; w > dirtyMB<<20/2 {
			t.Errorf("the %s wrote %d MB to the disk, with %d MB of the node's written but not yet written back", step.what, w>>20, dirtyMB)
		}
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/kept"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Fatalf("the committed branch's file in the sandbox: %q %v", out, err)
	}
	bc("fork", "sb")
	bc("abort", "sb/3")
}
