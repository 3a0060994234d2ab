//go:build linux

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client/branchapi"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter"
)

// TestCheckpointCrashSafety kills the snapshotter (SIGKILL from its own
// fault points) at every step of checkpoint and rollback of a running
// container, restarts it, and checks each operation is wholly there or
// wholly absent: a checkpoint killed before its record is gone with its
// layer; one killed after is complete; a rollback killed after its decision
// is completed on restart, seen by the running container; a delete killed
// after its record leaves layers start-up removes; nothing is left in the
// temporary places.
func TestCheckpointCrashSafety(t *testing.T) {
	ctx, env, c, root := sandboxEnv(t)
	crashAt := func(point string, op func(c *branchapi.Client) error) {
		t.Helper()
		if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := env.StartSnapshotter(ctx, "BRANCHBOX_FAULT_POINT="+point); err != nil {
			t.Fatal(err)
		}
		if err := op(dialBranches(t, env)); err == nil {
			t.Fatalf("%s: operation succeeded although the daemon was to die", point)
		}
		if err := env.WaitSnapshotterExit(10 * time.Second); err == nil {
			t.Fatalf("%s: daemon exited cleanly, want killed", point)
		}
		if err := env.StartSnapshotter(ctx); err != nil {
			t.Fatal(err)
		}
		c = dialBranches(t, env)
	}
	sh := func(script string) string {
		t.Helper()
		out, err := execIn(ctx, env, "sb", "sh", "-c", script)
		if err != nil {
			t.Fatalf("%s: %v: %s", script, err, out)
		}
		return out
	}
	names := func() map[string]bool {
		t.Helper()
		list, err := c.Checkpoints(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, ck := range list {
			out[ck.Name] = true
		}
		return out
	}
	// Every directory under checkpoints/<root>/ is a recorded layer, and
	// nothing is mounted or left under mnt/.
	leftovers := func(want int) {
		t.Helper()
		dirs, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "checkpoints", "*", "*"))
		tmp, _ := os.ReadDir(filepath.Join(env.SnapshotterRoot, "mnt"))
		if len(dirs) != want || len(tmp) != 0 {
			t.Fatalf("want %d checkpoint layers and no temporary mounts; have %v and %d in mnt", want, dirs, len(tmp))
		}
	}

	sh("echo one > /state")
	if _, err := c.Checkpoint(ctx, branch.Ref{Root: root}, "one"); err != nil {
		t.Fatal(err)
	}
	sh("echo two > /state; echo extra > /extra")
	// Killed before its record (its layer written, or in place and
	// synced): gone at the restart, layer and all.
	for _, point := range []string{snapshotter.FaultCheckpointWritten, snapshotter.FaultCheckpointInPlace} {
		crashAt(point, func(c *branchapi.Client) error {
			_, err := c.Checkpoint(ctx, branch.Ref{Root: root}, "lost")
			return err
		})
		if n := names(); len(n) != 1 || !n["one"] {
			t.Fatalf("checkpoint killed at %s, before its record: checkpoints %v, want only one", point, n)
		}
		leftovers(1)
	}
	crashAt(snapshotter.FaultCheckpointRecorded, func(c *branchapi.Client) error {
		_, err := c.Checkpoint(ctx, branch.Ref{Root: root}, "two")
		return err
	})
	if n := names(); len(n) != 2 || !n["two"] {
		t.Fatalf("checkpoint killed after its record: checkpoints %v, want one and two", n)
	}
	leftovers(2)

	for _, point := range []string{snapshotter.FaultRollbackDecided, snapshotter.FaultRollbackApplied, snapshotter.FaultRollbackFinished} {
		sh("echo dirty > /state; echo more > /more; rm -f /extra")
		crashAt(point, func(c *branchapi.Client) error { return c.Rollback(ctx, branch.Ref{Root: root}, "two") })
		// cat's errors go into what is compared, and a mismatch shows what
		// the upper on disk holds: a stale view of the live mount and a
		// wrong rollback read differently.
		if out := sh("cat /state /extra 2>&1; test -e /more || echo no-more"); out != "two\nextra\nno-more\n" {
			var disk []string
			for _, f := range []string{"state", "extra", "more"} {
				paths, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "snapshots", "*", "fs", f))
				for _, p := range paths {
					b, err := os.ReadFile(p)
					disk = append(disk, fmt.Sprintf("%s=%q(%v)", strings.TrimPrefix(p, env.SnapshotterRoot), b, err))
				}
			}
			t.Fatalf("%s: the running container reads %q after restart, want checkpoint two's state; on disk: %v", point, out, disk)
		}
		leftovers(2)
	}
	// After all that, the chain is still good: back to one.
	if err := c.Rollback(ctx, branch.Ref{Root: root}, "one"); err != nil {
		t.Fatal(err)
	}
	if out := sh("cat /state; test -e /extra || echo no-extra"); out != "one\nno-extra\n" {
		t.Fatalf("rollback to one after the crashes: %q", out)
	}

	// Deleting one, which two builds on, keeps its layer; deleting two then
	// leaves both layers to the crash, which start-up removes.
	crashAt(snapshotter.FaultCheckpointDeleted, func(c *branchapi.Client) error { return c.DeleteCheckpoint(ctx, root, "one") })
	if n := names(); len(n) != 1 || !n["two"] {
		t.Fatalf("delete killed after its record: checkpoints %v, want two", n)
	}
	leftovers(2)
	crashAt(snapshotter.FaultCheckpointDeleted, func(c *branchapi.Client) error { return c.DeleteCheckpoint(ctx, root, "two") })
	if n := names(); len(n) != 0 {
		t.Fatalf("delete killed after its record: checkpoints %v, want none", n)
	}
	leftovers(0)
}
