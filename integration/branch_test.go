//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
	"github.com/branchbox/branchbox/internal/ops"
	"github.com/branchbox/branchbox/snapshotter"
)

// sandboxEnv runs a container "sb" on the branch snapshotter that keeps
// running, and returns a branch client and the root naming its rootfs.
func sandboxEnv(t *testing.T) (context.Context, *daemons.Env, *branchapi.Client, branch.Root) {
	t.Helper()
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")
	if _, err := env.Ctr(ctx, "run", "-d", "--snapshotter", "branch", ociimage.ImageRef, "sb",
		"sh", "-c", "echo before > /state && exec sleep 600"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb") })
	waitFor(t, func() bool { out, _ := execIn(ctx, env, "sb", "cat", "/state"); return out == "before\n" })
	upper, err := env.RootfsUpperdir("sb")
	if err != nil {
		t.Fatal(err)
	}
	c := dialBranches(t, env)
	return ctx, env, c, branch.Root{Upperdir: upper}
}

func dialBranches(t *testing.T, env *daemons.Env) *branchapi.Client {
	t.Helper()
	c, err := branchapi.Dial(env.SnapshotterAddress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func removeContainer(t *testing.T, env *daemons.Env, id string) {
	ctx := context.Background()
	env.Ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
	for i := 0; i < 100; i++ {
		if _, err := env.Ctr(ctx, "tasks", "delete", id); err == nil || strings.Contains(err.Error(), "not found") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := env.Ctr(ctx, "containers", "delete", id); err != nil && !strings.Contains(err.Error(), "not found") {
		t.Errorf("delete container %s: %v", id, err)
	}
}

// execIn runs args in container id's task, as `ctr tasks exec` does, and
// returns its standard output; a failure or an exit other than 0 is an
// error that carries its output and standard error. It goes through the
// path of the HTTP API (internal/ops), not ctr: ctr 2.2 deletes the exec
// before its output has drained, and containerd's Process.Delete closes
// the FIFOs first, so under load ctr printed nothing for a process that
// wrote (containerd/containerd#13931, fixed after 2.2).
func execIn(ctx context.Context, env *daemons.Env, id string, args ...string) (string, error) {
	var stdout, stderr syncBuffer
	fail := func(err error) (string, error) {
		return stdout.String(), fmt.Errorf("exec %q in %s: %w\n%s%s", args, id, err, stdout.String(), stderr.String())
	}
	cc, err := containerd.New(env.Address)
	if err != nil {
		return fail(err)
	}
	defer cc.Close()
	p, err := ops.Exec(ctx, cc, &client.SandboxClient{ID: id, Namespace: env.Namespace}, branch.RootID,
		client.ExecOptions{Args: args, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return fail(err)
	}
	st, err := p.Wait(ctx)
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exit status %d", st.Code)
	}
	if err != nil {
		return fail(err)
	}
	return stdout.String(), nil
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached in 30s")
}

// mountBranch mounts a branch where the test can write into it, as a
// branch's processes would.
func mountBranch(t *testing.T, info branch.Info) string {
	t.Helper()
	dir := t.TempDir()
	if err := mount.All(info.Mounts, dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mount.UnmountAll(dir, unix.MNT_DETACH) })
	return dir
}

// TestBranchLiveSandbox forks a running container's rootfs: the container
// keeps running with a read-only rootfs, branches write privately, and the
// commit shows up at once inside the running container.
func TestBranchLiveSandbox(t *testing.T) {
	ctx, env, c, root := sandboxEnv(t)
	kids, err := c.Fork(ctx, branch.Ref{Root: root}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "echo x > /state"); err == nil || !strings.Contains(out+err.Error(), "Read-only file system") {
		t.Fatalf("sealed sandbox could write: %q %v", out, err)
	}
	d0, d1 := mountBranch(t, kids[0]), mountBranch(t, kids[1])
	if b, _ := os.ReadFile(filepath.Join(d0, "state")); string(b) != "before\n" {
		t.Fatalf("branch sees %q", b)
	}
	os.WriteFile(filepath.Join(d0, "state"), []byte("branch 1 won\n"), 0o644)
	os.WriteFile(filepath.Join(d1, "state"), []byte("branch 2 lost\n"), 0o644)
	if _, err := c.Commit(ctx, branch.Ref{Root: root, Branch: kids[0].ID}); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "branch 1 won\n" {
		t.Fatalf("running container reads %q %v after commit", out, err)
	}
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo after > /state2"); err != nil {
		t.Fatalf("sandbox not writable after commit: %v", err)
	}
	_, err = c.Commit(ctx, branch.Ref{Root: root, Branch: kids[1].ID})
	var se *branch.StaleError
	if !errors.As(err, &se) || se.Winner != kids[0].ID || se.WinnerEpoch != 1 {
		t.Fatalf("loser commit over gRPC: %v", err)
	}
	if !strings.Contains(err.Error(), "is stale") {
		t.Fatalf("message %q", err)
	}
	nodes, err := c.Tree(ctx, root)
	if err != nil || len(nodes) != 3 || nodes[0].Epoch != 1 {
		t.Fatalf("tree %+v %v", nodes, err)
	}
}

// TestBranchesSurviveGCAndGoWithTheirRoot: containerd's garbage collector
// never removes a live branch; removing the container removes the tree.
func TestBranchesSurviveGCAndGoWithTheirRoot(t *testing.T) {
	ctx, env, c, root := sandboxEnv(t)
	kids, err := c.Fork(ctx, branch.Ref{Root: root}, 2)
	if err != nil {
		t.Fatal(err)
	}
	// Make containerd collect: a throwaway snapshot is removed, and a
	// synchronous image removal forces a GC pass, which is what removes the
	// backend snapshot. Seeing its directory go proves the pass ran.
	snapDirs := func() int {
		d, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "snapshots", "*"))
		return len(d)
	}
	before := snapDirs()
	if _, err := env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "prepare", "throwaway"); err != nil {
		t.Fatal(err)
	}
	if snapDirs() != before+1 {
		t.Fatal("prepare made no snapshot directory")
	}
	if _, err := env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "rm", "throwaway"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "images", "tag", ociimage.ImageRef, "docker.io/branchbox/other:gc"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "images", "rm", "--sync", "docker.io/branchbox/other:gc"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return snapDirs() == before })
	nodes, err := c.Tree(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, n := range nodes {
		if n.State == branch.Live {
			live++
		}
	}
	if live != 3 {
		t.Fatalf("after GC %d live branches, want 3: %+v", live, nodes)
	}
	for _, k := range kids {
		if len(k.Mounts) == 0 {
			t.Fatal("fork returned no mounts")
		}
		upper := strings.TrimPrefix(optionWith(k.Mounts[0].Options, "upperdir="), "upperdir=")
		if _, err := os.Stat(upper); err != nil {
			t.Fatalf("branch layer gone after GC: %v", err)
		}
	}
	branchesDir := filepath.Join(env.SnapshotterRoot, "branches")
	removeContainer(t, env, "sb")
	waitFor(t, func() bool {
		entries, _ := os.ReadDir(branchesDir)
		return len(entries) == 0
	})
	if _, err := c.Tree(ctx, root); !errdefs.IsNotFound(err) {
		t.Fatalf("tree after the container is gone: %v", err)
	}
}

func optionWith(opts []string, prefix string) string {
	for _, o := range opts {
		if strings.HasPrefix(o, prefix) {
			return o
		}
	}
	return ""
}

// TestBranchCrashSafety kills the daemon with SIGKILL at each fault point
// of fork, commit and abort, restarts it, and checks the operation is
// either complete or absent, the sandbox intact, and nothing left over.
func TestBranchCrashSafety(t *testing.T) {
	ctx, env, c, root := sandboxEnv(t)
	crashAt := func(point string, op func(c *branchapi.Client) error) {
		t.Helper()
		if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := env.StartSnapshotter(ctx, "BRANCHBOX_FAULT_POINT="+point); err != nil {
			t.Fatal(err)
		}
		armed := dialBranches(t, env)
		opErr := op(armed)
		if opErr == nil {
			t.Fatalf("%s: operation succeeded although the daemon was to die", point)
		}
		if err := env.WaitSnapshotterExit(10 * time.Second); err == nil {
			t.Fatalf("%s: daemon exited cleanly, want killed", point)
		} else if !strings.Contains(err.Error(), "killed") {
			t.Fatalf("%s: daemon not killed at its fault point (%v); the operation failed with: %v", point, err, opErr)
		}
		if err := env.StartSnapshotter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	state := func() string {
		// /state is never empty here; an empty read is ctr exec losing a
		// short process's output under load (seen a few times in
		// TestBranchCrashSafety and TestBranchLiveSandbox), so it is read
		// again.
		for try := 0; ; try++ {
			out, err := execIn(ctx, env, "sb", "cat", "/state")
			if err != nil {
				t.Fatal(err)
			}
			if out != "" || try == 2 {
				return out
			}
		}
	}
	writable := func() bool {
		_, err := execIn(ctx, env, "sb", "sh", "-c", "echo probe > /probe")
		return err == nil
	}
	liveKids := func() []branch.Info {
		nodes, err := c.Tree(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		var out []branch.Info
		for _, n := range nodes {
			if n.ID != branch.RootID && n.State == branch.Live {
				out = append(out, n)
			}
		}
		return out
	}
	layers := func() int {
		var n int
		filepath.WalkDir(filepath.Join(env.SnapshotterRoot, "branches"), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && filepath.Base(p) == "work" {
				n++
			}
			return nil
		})
		return n
	}

	// Fork dies before its transaction: absent.
	crashAt(snapshotter.FaultForkDirs, func(c *branchapi.Client) error { _, err := c.Fork(ctx, branch.Ref{Root: root}, 2); return err })
	if k := liveKids(); len(k) != 0 || layers() != 0 || !writable() {
		t.Fatalf("fork crashed before commit: %d live branches, %d layers, writable %v", len(k), layers(), writable())
	}
	// Fork dies after its transaction, before sealing: complete, and sealed.
	crashAt(snapshotter.FaultForkCommitted, func(c *branchapi.Client) error { _, err := c.Fork(ctx, branch.Ref{Root: root}, 2); return err })
	kids := liveKids()
	if len(kids) != 2 || layers() != 2 || writable() {
		t.Fatalf("fork crashed after commit: %d live branches, %d layers, writable %v", len(kids), layers(), writable())
	}

	// Commit dies at each step: always complete after restart.
	for i, point := range []string{snapshotter.FaultCommitDecided, snapshotter.FaultCommitApplied, snapshotter.FaultCommitFinished} {
		if i > 0 {
			var err error
			if _, err = c.Fork(ctx, branch.Ref{Root: root}, 2); err != nil {
				t.Fatal(err)
			}
			kids = liveKids()
		}
		d := mountBranch(t, kids[0])
		want := "committed at " + point + "\n"
		os.WriteFile(filepath.Join(d, "state"), []byte(want), 0o644)
		mount.UnmountAll(d, 0)
		crashAt(point, func(c *branchapi.Client) error {
			_, err := c.Commit(ctx, branch.Ref{Root: root, Branch: kids[0].ID})
			return err
		})
		if got := state(); got != want {
			t.Fatalf("%s: sandbox reads %q, want %q", point, got, want)
		}
		if k := liveKids(); len(k) != 0 || layers() != 0 || !writable() {
			t.Fatalf("%s: %d live branches, %d layers, writable %v", point, len(k), layers(), writable())
		}
		_, err := c.Commit(ctx, branch.Ref{Root: root, Branch: kids[1].ID})
		if se := (*branch.StaleError)(nil); !errors.As(err, &se) || se.Winner != kids[0].ID {
			t.Fatalf("%s: loser: %v", point, err)
		}
	}

	// Abort dies at each step: complete after restart, parent unsealed.
	for _, point := range []string{snapshotter.FaultAbortDecided, snapshotter.FaultAbortRemoved} {
		kids, err := c.Fork(ctx, branch.Ref{Root: root}, 1)
		if err != nil {
			t.Fatal(err)
		}
		before := state()
		crashAt(point, func(c *branchapi.Client) error {
			_, err := c.Abort(ctx, branch.Ref{Root: root, Branch: kids[0].ID})
			return err
		})
		if k := liveKids(); len(k) != 0 || layers() != 0 || !writable() || state() != before {
			t.Fatalf("%s: %d live branches, %d layers, writable %v", point, len(k), layers(), writable())
		}
	}
	if m, _ := daemons.MountsUnder(filepath.Join(env.SnapshotterRoot, "mnt")); len(m) != 0 {
		t.Fatalf("temporary mounts left: %v", m)
	}
}

// TestBranchQuarantineDaemon: a decided commit that the restarted daemon
// cannot complete (its layer got what the apply refuses while the daemon
// was down) does not keep the daemon from starting: the tree is
// quarantined, its operations refused with the cause, every other
// snapshot call served; a retried commit completes it once the cause is
// gone.
func TestBranchQuarantineDaemon(t *testing.T) {
	ctx, env, c, root := sandboxEnv(t)
	kids, err := c.Fork(ctx, branch.Ref{Root: root}, 2)
	if err != nil {
		t.Fatal(err)
	}
	d := mountBranch(t, kids[0])
	if err := os.MkdirAll(filepath.Join(d, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "state"), []byte("won\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mount.UnmountAll(d, 0)

	if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := env.StartSnapshotter(ctx, "BRANCHBOX_FAULT_POINT="+snapshotter.FaultCommitDecided); err != nil {
		t.Fatal(err)
	}
	if _, err := dialBranches(t, env).Commit(ctx, branch.Ref{Root: root, Branch: kids[0].ID}); err == nil {
		t.Fatal("commit succeeded although the daemon was to die at its decision")
	}
	if err := env.WaitSnapshotterExit(10 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("daemon not killed at its fault point: %v", err)
	}
	upper := strings.TrimPrefix(optionWith(kids[0].Mounts[0].Options, "upperdir="), "upperdir=")
	redirect := filepath.Join(upper, "dir")
	if err := unix.Setxattr(redirect, "trusted.overlay.redirect", []byte("/elsewhere"), 0); err != nil {
		t.Fatal(err)
	}
	if err := env.StartSnapshotter(ctx); err != nil {
		t.Fatalf("the daemon did not start with a tree it cannot recover: %v", err)
	}
	c = dialBranches(t, env)
	nodes, err := c.Tree(ctx, root)
	if err != nil {
		t.Fatalf("tree of the quarantined sandbox: %v", err)
	}
	var cause string
	for _, n := range nodes {
		if n.ID == branch.RootID {
			cause = n.Quarantine
		}
	}
	if !strings.Contains(cause, "redirect") {
		t.Fatalf("tree does not name the cause of the quarantine: %q", cause)
	}
	if _, err := c.Fork(ctx, branch.Ref{Root: root}, 1); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "redirect") {
		t.Fatalf("fork of a quarantined tree: %v", err)
	}
	// containerd's own snapshot calls are served, the sandbox runs as it was.
	if out, err := env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "ls"); err != nil || !strings.Contains(out, "sb") {
		t.Fatalf("ctr snapshots ls: %v\n%s", err, out)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "before\n" {
		t.Fatalf("sandbox reads %q (%v), want its state before the commit", out, err)
	}
	if err := unix.Removexattr(redirect, "trusted.overlay.redirect"); err != nil {
		t.Fatal(err)
	}
	// The retry completes the commit and answers with its result.
	if res, err := c.Commit(ctx, branch.Ref{Root: root, Branch: kids[0].ID}); err != nil || len(res.Invalidated) != 1 || res.Invalidated[0] != kids[1].ID {
		t.Fatalf("retried commit once the cause is gone: %+v, %v; want it to report invalidating branch %s", res, err, kids[1].ID)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "won\n" {
		t.Fatalf("sandbox reads %q (%v) after the retried commit", out, err)
	}
}
