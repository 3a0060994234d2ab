//go:build linux

package integration

import (
	"os"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fstest"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestCheckpointMappedWritesTmpfs: on a node whose containerd and
// snapshotter state is on a tmpfs, a sandbox's process that keeps a file
// mapped and writes it through the mapping (an mmap'ed database) has its
// writes in the checkpoints taken, and a rollback under it brings the
// file back. Before, tmpfs changed no ctime at a mapped write and both
// checkpoints held what the first write made; the rollbacks left the
// last write in place.
func TestCheckpointMappedWritesTmpfs(t *testing.T) {
	requireRoot(t)
	mnt := t.TempDir()
	// Registered first, so detached after the env is stopped.
	fstest.Tmpfs(t, mnt, "size=1g")
	// A name of its own: the env's namespace is named after it.
	dir, err := os.MkdirTemp(mnt, "env-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, env, _ := shimEnvWith(t, daemons.Config{Dir: dir})
	importPythonImage(t, ctx, env)
	sc := runSandbox(t, ctx, env, ociimage.PythonImageRef, "sh", "-c", pyREPL)
	waitFor(t, func() bool { _, err := execIn(ctx, env, "sb", "test", "-p", "/dev/shm/in"); return err == nil })

	pyIn(t, ctx, env, sc, branch.RootID, `import mmap, os; fd = os.open('/db', os.O_RDWR | os.O_CREAT); os.ftruncate(fd, 4096); m = mmap.mmap(fd, 4096); print('mapped')`, "mapped")
	// Each step older than a tick of the clock ctimes are stamped with.
	step := func(line, want string) {
		t.Helper()
		time.Sleep(100 * time.Millisecond)
		pyIn(t, ctx, env, sc, branch.RootID, line, want)
		time.Sleep(100 * time.Millisecond)
	}
	head := func(what, want string) {
		t.Helper()
		out, err := execIn(ctx, env, "sb", "head", "-c", "3", "/db")
		if err != nil || out != want {
			t.Fatalf("%s: /db starts %q (%v), want %q", what, out, err, want)
		}
	}
	step(`m[0:1] = b'a'; print('one written')`, "one written")
	if _, err := sc.Checkpoint(ctx, "", "one"); err != nil {
		t.Fatal(err)
	}
	step(`m[1:2] = b'b'; print('two written')`, "two written")
	if _, err := sc.Checkpoint(ctx, "", "two"); err != nil {
		t.Fatal(err)
	}
	step(`m[2:3] = b'c'; print('three written')`, "three written")
	head("before the rollbacks", "abc")
	if err := sc.Rollback(ctx, "", "two"); err != nil {
		t.Fatal(err)
	}
	head("after the rollback to two", "ab\x00")
	if err := sc.Rollback(ctx, "", "one"); err != nil {
		t.Fatal(err)
	}
	head("after the rollback to one", "a\x00\x00")
}
