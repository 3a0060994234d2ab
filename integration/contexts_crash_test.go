//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client/branchapi"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/snapshotter"
)

// daemonScript leaves, in a branch, a setsid daemon that ignores SIGTERM,
// after writing the branch's marker file name under /m.
func daemonScript(marker string) string {
	return fmt.Sprintf(`mkdir -p /m && echo %s > /m/%s && setsid sh -c 'trap "" TERM; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &`, marker, marker)
}

// startDaemon writes a marker in branch k and leaves a daemon running in it;
// it returns the branch's processes seen from the host once the daemon is
// among them.
func startDaemon(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, k client.BranchInfo, marker string) []hostProc {
	t.Helper()
	mustRun(t, ctx, sc, k.ID, "sh", "-c", daemonScript(marker))
	var procs []hostProc
	waitUntil(t, "the daemon of branch "+k.ID, 10*time.Second, func() bool {
		procs = branchProcs(env, k)
		for _, p := range procs {
			if strings.Contains(p.cmd, "while") {
				return true
			}
		}
		return false
	})
	return procs
}

// runsFreely says whether a command runs in branch k within a few seconds
// (it would not in a frozen branch), and what it got.
func runsFreely(ctx context.Context, sc *client.SandboxClient, k, want string, args ...string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, st, err := runErr(ctx, sc, k, args...)
	return err == nil && st.Code == 0 && out == want, fmt.Sprintf("%q, exit %d, %v", out, st.Code, err)
}

// rootMarkers lists the marker files the sandbox's running processes see
// under /m (besides /m/base, there from the start, which tells an empty
// read of ctr's from an empty directory).
func rootMarkers(t *testing.T, ctx context.Context, env *daemons.Env, id string) []string {
	t.Helper()
	for try := 0; ; try++ {
		out, err := execIn(ctx, env, id, "ls", "/m")
		if err != nil {
			t.Fatalf("list /m in %s: %v", id, err)
		}
		var names []string
		base := false
		for _, f := range strings.Fields(out) {
			if f == "base" {
				base = true
			} else {
				names = append(names, f)
			}
		}
		if base || try == 2 {
			if !base {
				t.Fatalf("/m/base missing in %s: %q", id, out)
			}
			sort.Strings(names)
			return names
		}
	}
}

// snapshotterRoot dials env's snapshotter directly (behind the shim's
// back) and names the root of sandbox id there; the caller closes the
// client.
func snapshotterRoot(t *testing.T, env *daemons.Env, id string) (*branchapi.Client, branch.Root) {
	t.Helper()
	upper, err := env.RootfsUpperdir(id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := branchapi.Dial(env.SnapshotterAddress)
	if err != nil {
		t.Fatal(err)
	}
	return c, branch.Root{Upperdir: upper}
}

// liveInSnapshotter lists the live branches of a sandbox as the
// snapshotter's own tree has them.
func liveInSnapshotter(t *testing.T, ctx context.Context, env *daemons.Env, id string) []string {
	t.Helper()
	c, root := snapshotterRoot(t, env, id)
	defer c.Close()
	var nodes []branch.Info
	var err error
	for try := 0; ; try++ {
		// The first call after a restart may find the socket not yet served.
		if nodes, err = c.Tree(ctx, root); err == nil || try == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("snapshotter tree of %s: %v", id, err)
	}
	var out []string
	for _, n := range nodes {
		if n.ID != branch.RootID && n.State == branch.Live {
			out = append(out, n.ID)
		}
	}
	sort.Strings(out)
	return out
}

// runningInShim lists the branches the shim runs.
func runningInShim(t *testing.T, ctx context.Context, sc *client.SandboxClient) []string {
	t.Helper()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatalf("tree through the shim: %v", err)
	}
	var out []string
	for _, n := range nodes {
		if n.ID != branch.RootID && n.Status != "" {
			out = append(out, n.ID)
		}
	}
	sort.Strings(out)
	return out
}

// branchCgroupsOf lists the branch cgroups left below a sandbox's cgroup on
// every hierarchy, and processes in any of them. A cgroup whose processes
// are all inits waiting for a branch (the pool's, started in the cgroup of
// a branch id not given yet) is not left, on any hierarchy: such an init is
// born in its pids and memory cgroups and moved into the others a moment
// later, so for that moment its cgroup there is empty. An init being born
// is not named as waiting yet (it is the shim's clone until its exec): the
// cgroups are read again for a while, and only what stays is left.
func branchCgroupsOf(namespace, id string) ([]string, []int) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		dirs, pids := branchCgroupsOnce(namespace, id)
		if len(dirs) == 0 || time.Now().After(deadline) {
			return dirs, pids
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func branchCgroupsOnce(namespace, id string) ([]string, []int) {
	top := "/" + namespace + "/" + id
	all, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", top, "b[0-9]*"))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", top, "b[0-9]*"))
	type found struct {
		dirs    []string
		pids    []int
		waiting bool
	}
	byName := map[string]*found{}
	var names []string
	for _, d := range append(all, v2...) {
		if !isDirPath(d) {
			continue
		}
		f := byName[filepath.Base(d)]
		if f == nil {
			f = &found{waiting: true}
			byName[filepath.Base(d)] = f
			names = append(names, filepath.Base(d))
		}
		f.dirs = append(f.dirs, d)
		for _, sub := range walkDirs(d) {
			b, _ := os.ReadFile(filepath.Join(sub, "cgroup.procs"))
			for _, field := range strings.Fields(string(b)) {
				if p, err := strconv.Atoi(field); err == nil {
					f.pids = append(f.pids, p)
					comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
					f.waiting = f.waiting && strings.TrimSpace(string(comm)) == "brinit-wait"
				}
			}
		}
	}
	var dirs []string
	var pids []int
	for _, n := range names {
		if f := byName[n]; len(f.pids) == 0 || !f.waiting {
			dirs = append(dirs, f.dirs...)
			pids = append(pids, f.pids...)
		}
	}
	return dirs, pids
}

func walkDirs(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestContextsCommitSnapshotterDown commits through the shim while the
// snapshotter is stopped (the branch must run on, committable), and while
// the snapshotter dies at each fault point of a commit (decided, applied,
// finished): once it is back, the shim learns the commit was made and,
// with no call from anyone, kills the losers, each with a setsid daemon
// that ignores SIGTERM; a retried commit returns the commit's result; no
// branch is left live in the snapshotter that the shim does not run.
func TestContextsCommitSnapshotterDown(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	mustBase := func() {
		if _, err := execIn(ctx, env, "sb", "sh", "-c", "mkdir -p /m && touch /m/base"); err != nil {
			t.Fatal(err)
		}
	}
	mustBase()

	t.Run("stopped", func(t *testing.T) {
		restartSnapshotterAfter(t, ctx, env)
		kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
		a, b := kids[0], kids[1]
		aProcs := startDaemon(t, ctx, env, sc, a, "stopped-a")
		bProcs := startDaemon(t, ctx, env, sc, b, "stopped-b")
		if err := env.StopSnapshotter(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_, err := sc.Commit(ctx, a.ID)
		if err == nil {
			t.Fatal("commit succeeded with the snapshotter stopped")
		}
		if !errdefs.IsUnavailable(err) {
			t.Errorf("commit with the snapshotter stopped: %v; want unavailable", err)
		}
		// Not made: both run on, a not frozen.
		if ok, got := runsFreely(ctx, sc, a.ID, "stopped-a\n", "cat", "/m/stopped-a"); !ok {
			t.Fatalf("the winner of a commit that was not made does not run freely: %s", got)
		}
		if left := survivors(aProcs); len(left) != len(aProcs) {
			t.Fatalf("processes of the branch of a commit not made died: %d of %d left", len(left), len(aProcs))
		}
		if left := survivors(bProcs); len(left) != len(bProcs) {
			t.Fatalf("processes of a sibling died with no commit made: %d of %d left", len(left), len(bProcs))
		}
		if err := env.StartSnapshotter(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := sc.Commit(ctx, a.ID)
		if err != nil {
			t.Fatalf("commit once the snapshotter is back: %v", err)
		}
		if len(res.Invalidated) != 1 || res.Invalidated[0] != b.ID {
			t.Fatalf("invalidated %v, want [%s]", res.Invalidated, b.ID)
		}
		assertBranchGone(t, env, a, aProcs)
		assertBranchGone(t, env, b, bProcs)
		if got := rootMarkers(t, ctx, env, "sb"); len(got) != 1 || got[0] != "stopped-a" {
			t.Fatalf("sandbox sees markers %v, want [stopped-a]", got)
		}
	})

	for _, point := range []string{snapshotter.FaultCommitDecided, snapshotter.FaultCommitApplied, snapshotter.FaultCommitFinished} {
		t.Run(point, func(t *testing.T) {
			restartSnapshotterAfter(t, ctx, env)
			before := rootMarkers(t, ctx, env, "sb")
			kids := fork(t, ctx, sc, client.ForkOptions{Count: 3})
			a := kids[0]
			marker := "won-" + strings.ReplaceAll(point, ":", "-")
			aProcs := startDaemon(t, ctx, env, sc, a, marker)
			var losers [][]hostProc
			for i, k := range kids[1:] {
				losers = append(losers, startDaemon(t, ctx, env, sc, k, fmt.Sprintf("lost-%s-%d", strings.ReplaceAll(point, ":", "-"), i)))
			}
			if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := env.StartSnapshotter(ctx, "BRANCHBOX_FAULT_POINT="+point); err != nil {
				t.Fatal(err)
			}
			_, err := sc.Commit(ctx, a.ID)
			if err == nil {
				t.Fatalf("commit succeeded although the snapshotter was to die at %s", point)
			}
			if err := env.WaitSnapshotterExit(10 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("snapshotter not killed at %s: %v", point, err)
			}
			// The outcome is unknown while the snapshotter is down: the
			// winner is held frozen, and says so.
			if !errdefs.IsUnavailable(err) {
				t.Fatalf("commit cut short at %s: %v; want unavailable (outcome unknown)", point, err)
			}
			if _, _, err := runErr(ctx, sc, a.ID, "true"); !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("exec in the winner of a commit of unknown outcome: %v; want failed precondition", err)
			}
			if err := env.StartSnapshotter(ctx); err != nil {
				t.Fatal(err)
			}
			// Nobody calls the shim: it learns of the decision by itself.
			for i, k := range kids[1:] {
				waitUntil(t, "the losers' processes to die", 10*time.Second, func() bool { return len(survivors(losers[i])) == 0 })
				assertBranchGone(t, env, k, losers[i])
			}
			assertBranchGone(t, env, a, aProcs)
			want := append(append([]string{}, before...), marker)
			sort.Strings(want)
			if got := rootMarkers(t, ctx, env, "sb"); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("sandbox sees markers %v, want %v", got, want)
			}
			// The retried commit returns the commit's result.
			res, err := sc.Commit(ctx, a.ID)
			if err != nil {
				t.Fatalf("retried commit: %v", err)
			}
			if len(res.Invalidated) != 2 || res.Invalidated[0] != kids[1].ID || res.Invalidated[1] != kids[2].ID {
				t.Fatalf("retried commit: invalidated %v, want [%s %s]", res.Invalidated, kids[1].ID, kids[2].ID)
			}
			if res.Parent.ID != branch.RootID || len(res.Parent.Children) != 0 {
				t.Fatalf("retried commit: parent %+v, want the root with no children", res.Parent)
			}
			var se *branch.StaleError
			if _, err := sc.Abort(ctx, kids[1].ID); !errors.As(err, &se) || se.Winner != a.ID {
				t.Fatalf("abort of a loser: %v; want stale naming %s", err, a.ID)
			}
			if live := liveInSnapshotter(t, ctx, env, "sb"); len(live) != 0 {
				t.Fatalf("branches live in the snapshotter after the commit: %v", live)
			}
			if dirs, pids := branchCgroupsOf(env.Namespace, "sb"); len(dirs) != 0 || len(pids) != 0 {
				t.Fatalf("branch cgroups left: %v (processes %v)", dirs, pids)
			}
			// The sandbox is writable again.
			if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo x > /probe"); err != nil {
				t.Fatalf("sandbox not writable after the commit: %v", err)
			}
		})
	}
}

// restartSnapshotterAfter starts the snapshotter again when t ends, if
// it is down: a subtest that fails with the snapshotter down must not take
// the next ones with it.
func restartSnapshotterAfter(t *testing.T, ctx context.Context, env *daemons.Env) {
	t.Cleanup(func() {
		if env.SnapshotterPid() == 0 {
			if err := env.StartSnapshotter(ctx); err != nil {
				t.Errorf("restart the snapshotter: %v", err)
			}
		}
	})
}

// TestContextsAbortSnapshotterDown aborts the only branch of the sandbox
// through the shim while the snapshotter is stopped, and while it dies at
// each fault point of an abort (decided, layer removed): the abort runs
// the snapshotter's part while the branch's processes die, so whatever the
// snapshotter does, the reply comes only once the branch's daemon is gone.
// Once the snapshotter is back, the branch is gone there too (nobody calls
// the shim: it reconciles by itself), no cgroup is left and the sandbox,
// which the fork sealed, is writable again.
func TestContextsAbortSnapshotterDown(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "mkdir -p /m && touch /m/base"); err != nil {
		t.Fatal(err)
	}
	for _, point := range []string{"stopped", snapshotter.FaultAbortDecided, snapshotter.FaultAbortRemoved} {
		t.Run(point, func(t *testing.T) {
			restartSnapshotterAfter(t, ctx, env)
			kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
			a := kids[0]
			procs := startDaemon(t, ctx, env, sc, a, "aborted-"+strings.ReplaceAll(point, ":", "-"))
			var daemon []hostProc
			for _, p := range procs {
				if strings.Contains(p.cmd, "while") {
					daemon = append(daemon, p)
				}
			}
			if point == "stopped" {
				if err := env.StopSnapshotter(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if err := env.StartSnapshotter(ctx, "BRANCHBOX_FAULT_POINT="+point); err != nil {
					t.Fatal(err)
				}
			}
			_, err := sc.Abort(ctx, a.ID)
			// Checked first: the daemon must be gone when the reply comes.
			if left := survivors(daemon); len(left) != 0 {
				t.Fatalf("the branch's daemon outlived the abort's reply: %v", left)
			}
			if err == nil {
				t.Fatalf("abort succeeded with the snapshotter %s", point)
			}
			t.Logf("abort with the snapshotter %s: %v", point, err)
			if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "processes were killed") {
				t.Fatalf("abort with the snapshotter %s: %v; want unavailable, saying its processes were killed", point, err)
			}
			if point != "stopped" {
				if err := env.WaitSnapshotterExit(10 * time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("snapshotter not killed at %s: %v", point, err)
				}
			}
			if err := env.StartSnapshotter(ctx); err != nil {
				t.Fatal(err)
			}
			assertBranchGone(t, env, a, procs)
			waitUntil(t, "the branch to leave the snapshotter", 10*time.Second, func() bool {
				return len(liveInSnapshotter(t, ctx, env, "sb")) == 0
			})
			if _, err := sc.Abort(ctx, a.ID); !errdefs.IsNotFound(err) {
				t.Fatalf("abort again: %v; want not found", err)
			}
			if dirs, pids := branchCgroupsOf(env.Namespace, "sb"); len(dirs) != 0 || len(pids) != 0 {
				t.Fatalf("branch cgroups left: %v (processes %v)", dirs, pids)
			}
			waitUntil(t, "the sandbox to be writable again", 10*time.Second, func() bool {
				_, err := execIn(ctx, env, "sb", "sh", "-c", "echo x > /probe")
				return err == nil
			})
			if got := rootMarkers(t, ctx, env, "sb"); len(got) != 0 {
				t.Fatalf("the aborted branch's marker reached the sandbox: %v", got)
			}
		})
	}
}
