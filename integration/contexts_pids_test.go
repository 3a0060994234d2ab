//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// pidsLimit is the sandboxes' process limit: room for a dozen branches
// and for branchctl (a Go program, whose threads count) run inside.
const pidsLimit = 20

// execPids is room enough for an exec of branchctl into the sandbox: runc
// exec's own process and branchctl's threads.
const execPids = 10

// TestContextsPidsLimit: a sandbox with a process limit (pids.max) forks
// one branch at a time until the limit refuses a fork, on the branch-init
// path and on the runtime path (CAP_SYS_PTRACE keeps a branch off the
// init). After every fork, read from the host, the sandbox's pids cgroup
// has pids.current <= pids.max, and its pids.peak never passed pids.max (a
// process moved into a v1 cgroup unchecked would). The refusal is one line
// naming the limit, resource exhausted, and leaves the tree, the mounts
// and the cgroups as they were, whether it was refused up front (a fork of
// more than is left) or by the kernel and rolled back (a branch whose own
// limit refuses its command, on the init path; a start the runtime could
// not finish, on the runtime path). `branchctl fork` from the host and
// `branchctl self fork` from inside are refused the same way. Once branches are aborted, forks work again.
func TestContextsPidsLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps []string
	}{
		{"init", nil},
		{"runtime", []string{"CAP_SYS_PTRACE"}},
	} {
		t.Run(tc.name, func(t *testing.T) { testPidsLimit(t, tc.name == "init", tc.caps) })
	}
}

func testPidsLimit(t *testing.T, initPath bool, caps []string) {
	ctx, env, cc := shimEnv(t)
	importInsockImage(t, ctx, env)
	sc := runPidsSandbox(t, ctx, env, cc, "sb", caps)
	cg := rootCgroup(t, ctx, sc)
	pidsDir := filepath.Join("/sys/fs/cgroup/pids", cg)
	if _, err := os.Stat(filepath.Join(pidsDir, "pids.max")); err != nil {
		pidsDir = filepath.Join("/sys/fs/cgroup", cg) // cgroup v2
	}
	check := func(when string) (current, max int64) {
		t.Helper()
		current, max = readCount(t, pidsDir, "pids.current"), readCount(t, pidsDir, "pids.max")
		if max != pidsLimit {
			t.Fatalf("%s: pids.max %d, want %d", when, max, pidsLimit)
		}
		if current > max {
			t.Errorf("%s: pids.current %d > pids.max %d", when, current, max)
		}
		if peak, err := os.ReadFile(filepath.Join(pidsDir, "pids.peak")); err == nil {
			if p, _ := strconv.ParseInt(strings.TrimSpace(string(peak)), 10, 64); p > max {
				t.Errorf("%s: pids.peak %d > pids.max %d: a process was put in past the limit", when, p, max)
			}
		}
		return current, max
	}
	refused := func(err error, what string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: not refused", what)
		}
		msg := err.Error()
		if !errdefs.IsResourceExhausted(err) || strings.Contains(msg, "\n") ||
			!strings.Contains(msg, fmt.Sprintf("process limit (pids.max %d) is reached", pidsLimit)) {
			t.Errorf("%s: refused with %q; want one line naming the process limit, resource exhausted", what, msg)
		}
	}
	check("before any fork")

	// One at a time until the limit refuses one.
	var made []client.BranchInfo
	var last error
	for i := 0; i < pidsLimit+2; i++ {
		before := forkState(t, ctx, env, sc, cg)
		kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
		check(fmt.Sprintf("after fork %d", i+1))
		if err != nil {
			last = err
			if after := forkState(t, ctx, env, sc, cg); !slices.Equal(before, after) {
				t.Errorf("a refused fork changed the sandbox:\nbefore %v\nafter  %v", before, after)
			}
			break
		}
		made = append(made, kids...)
	}
	refused(last, "fork past the limit")
	if !strings.Contains(last.Error(), "fork of sandbox sb: the sandbox's process limit") {
		t.Errorf("refusal %q does not name the sandbox's limit", last)
	}
	// A branch init is one process; the runtime's init waiting for its
	// start is a Go program, whose threads count.
	if fit := map[bool]int{true: pidsLimit - 3, false: 2}[initPath]; len(made) < fit {
		t.Errorf("only %d branches fit under a limit of %d, want %d", len(made), pidsLimit, fit)
	}
	t.Logf("%d branches made; refused with: %v", len(made), last)
	// The command line says the same, in one line.
	before := forkState(t, ctx, env, sc, cg)
	if stdout, stderr, code := branchctl(t, ctx, env, "", "fork", "sb", "-n", "12"); code == 0 ||
		strings.Count(strings.TrimSpace(stderr), "\n") != 0 ||
		!strings.HasPrefix(stderr, fmt.Sprintf("branchctl fork: fork of sandbox sb: the sandbox's process limit (pids.max %d) is reached", pidsLimit)) ||
		!strings.HasSuffix(stderr, ": resource exhausted\n") {
		t.Errorf("branchctl fork sb -n 12: exit %d, stdout %q, stderr %q; want one line naming the limit", code, stdout, stderr)
	}
	if after := forkState(t, ctx, env, sc, cg); !slices.Equal(before, after) {
		t.Errorf("a refused branchctl fork changed the sandbox:\nbefore %v\nafter  %v", before, after)
	}
	check("after branchctl fork")
	if initPath {
		// Born in its pids and memory cgroups, moved into the rest before
		// the fork replied: an init is in its branch's cgroup on every
		// hierarchy.
		for _, k := range made {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", k.InitPid))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if f := strings.SplitN(l, ":", 3); len(f) == 3 && f[2] != k.Cgroup {
					t.Errorf("branch %s's init (pid %d) is in %s, not its cgroup %s", k.ID, k.InitPid, l, k.Cgroup)
				}
			}
		}
	}

	// Room again; a fork of more than is left is refused up front and
	// changes nothing.
	for _, k := range made[len(made)/2:] {
		if _, err := sc.Abort(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
	made = made[:len(made)/2]
	_, max := check("after aborts")
	before = forkState(t, ctx, env, sc, cg)
	// More than the whole limit: what is left may grow while the aborted
	// branches' last processes are reaped (on v1 the forking thread's one
	// pid hid that).
	_, err := sc.Fork(ctx, client.ForkOptions{Count: int(max) + 1})
	refused(err, "fork of more than is left")
	if !strings.Contains(err.Error(), "free, the fork needs") {
		t.Errorf("a fork of more than is left was not refused up front: %v", err)
	}
	if after := forkState(t, ctx, env, sc, cg); !slices.Equal(before, after) {
		t.Errorf("a fork refused up front changed the sandbox:\nbefore %v\nafter  %v", before, after)
	}
	check("after a fork refused up front")

	if initPath {
		// Refused by the kernel mid-fork: the branch's own limit of 1
		// leaves its init no room for its command. Rolled back.
		before := forkState(t, ctx, env, sc, cg)
		_, err := sc.Fork(ctx, client.ForkOptions{Count: 1, Pids: 1, Args: []string{"sleep", "1000"}})
		if err == nil || !errdefs.IsResourceExhausted(err) || strings.Contains(err.Error(), "\n") ||
			!strings.Contains(err.Error(), "the new branch's own process limit (pids.max 1)") {
			t.Errorf("a command over its branch's own limit: %v; want one line naming that limit", err)
		}
		if after := forkState(t, ctx, env, sc, cg); !slices.Equal(before, after) {
			t.Errorf("a fork rolled back changed the sandbox:\nbefore %v\nafter  %v", before, after)
		}
		check("after a fork refused by the branch's own limit")
	}

	// From inside: branchctl self fork, until refused.
	for _, k := range made {
		if _, err := sc.Abort(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
	check("after aborting every branch")
	// Forks of 3 while there is room for them and for the exec that asks
	// (runc's and branchctl's threads count too), then one of 30, which
	// the limit must refuse: a sandbox full to the last pid could not
	// even start branchctl, and the kernel, not the shim, would refuse
	// the exec.
	selfRefused := ""
	for i := 0; i < pidsLimit && selfRefused == ""; i++ {
		before := forkState(t, ctx, env, sc, cg)
		n := "3"
		if cur, max := check("before a self fork"); max-cur < 3+execPids {
			n = "30"
		}
		stdout, stderr, code := ctrExit(ctx, env, "tasks", "exec", "--exec-id", "self"+strconv.Itoa(i), "sb", "branchctl", "self", "fork", "-n", n)
		check(fmt.Sprintf("after self fork %d (-n %s)", i+1, n))
		if code == 0 && n == "30" {
			t.Fatal("self fork -n 30 was not refused")
		}
		if code != 0 {
			// ctr's own warnings (cgroup v1 deprecation) are not ours.
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(stdout+stderr), "\n") {
				if !strings.HasPrefix(l, "time=") {
					lines = append(lines, l)
				}
			}
			selfRefused = strings.Join(lines, "\n")
			if after := forkState(t, ctx, env, sc, cg); !slices.Equal(before, after) {
				t.Errorf("a refused self fork changed the sandbox:\nbefore %v\nafter  %v", before, after)
			}
			break
		}
	}
	if selfRefused == "" {
		t.Fatal("self fork from inside was never refused")
	}
	t.Logf("self fork refused with: %s", selfRefused)
	if strings.Contains(selfRefused, "\n") || !strings.Contains(selfRefused, fmt.Sprintf("the sandbox's process limit (pids.max %d) is reached", pidsLimit)) {
		t.Errorf("self fork refused with %q; want one line naming the sandbox's process limit", selfRefused)
	}

	// Aborted, the sandbox forks again.
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range tree {
		if n.ID != branch.RootID && n.Parent == branch.RootID && n.State == branch.Live {
			if _, err := sc.Abort(ctx, n.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	fork(t, ctx, sc, client.ForkOptions{Count: 2})
	check("after forking again")
}

// runPidsSandbox runs sandbox id of the insock image (busybox and
// branchctl) with the branch socket and the process limit pidsLimit, and
// caps added to its process.
func runPidsSandbox(t *testing.T, ctx context.Context, env *daemons.Env, cc *containerd.Client, id string, caps []string) *client.SandboxClient {
	t.Helper()
	img, err := cc.GetImage(ctx, insockImage)
	if err != nil {
		t.Fatal(err)
	}
	opts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs("sh", "-c", "exec sleep 100000"),
		oci.WithPidsLimit(pidsLimit), oci.WithAnnotations(map[string]string{"io.branchbox.socket": "true"})}
	if len(caps) > 0 {
		opts = append(opts, oci.WithAddedCapabilities(caps))
	}
	c, err := cc.NewContainer(ctx, id,
		containerd.WithSnapshotter("branch"),
		containerd.WithNewSnapshot(id, img),
		containerd.WithRuntime(branchRuntime, nil),
		containerd.WithNewSpec(opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, id) })
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

// rootCgroup is the sandbox's cgroup path, as its tree says.
func rootCgroup(t *testing.T, ctx context.Context, sc *client.SandboxClient) string {
	t.Helper()
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range tree {
		if n.ID == branch.RootID && n.Cgroup != "" {
			return n.Cgroup
		}
	}
	t.Fatalf("no cgroup for the sandbox in its tree %+v", tree)
	return ""
}

func readCount(t *testing.T, dir, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s/%s: %q", dir, file, b)
	}
	return n
}

// forkState is what a fork changes, as seen from the host: the live
// branches of the tree, the mounts under the sandbox's bundle, the branch
// sockets' directories, and the cgroups below the sandbox's on every
// hierarchy (but the warm pool's, which fills in the background). The
// removal of an aborted branch's cgroups goes on after the abort replies:
// the state is read until two reads agree.
func forkState(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, cg string) []string {
	t.Helper()
	prev := readForkState(t, ctx, env, sc, cg)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		cur := readForkState(t, ctx, env, sc, cg)
		if slices.Equal(prev, cur) {
			return cur
		}
		prev = cur
	}
	t.Fatalf("the sandbox's branches, mounts and cgroups did not settle in 10 s: %v", prev)
	return nil
}

func readForkState(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, cg string) []string {
	t.Helper()
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range tree {
		if n.State == branch.Live {
			out = append(out, "branch "+n.ID)
		}
	}
	bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb")
	ms, _ := daemons.MountsUnder(bundle)
	for _, m := range ms {
		out = append(out, "mount "+m)
	}
	for _, d := range socketDirs(env, "sb") {
		out = append(out, "socket "+d)
	}
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cg))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", cg))
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() || p == d {
				return nil
			}
			if strings.HasPrefix(e.Name(), "bbx-pool-") {
				return filepath.SkipDir
			}
			out = append(out, "cgroup "+p)
			return nil
		})
	}
	slices.Sort(out)
	return out
}

// TestContextsExecAtPidsLimit: an exec into a branch at its own process
// limit (a fork with --pids 1: its init alone fills it) is refused in one
// line naming the limit, resource exhausted; before, the start's
// "Resource temporarily unavailable", of no kind.
func TestContextsExecAtPidsLimit(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	sc := runSandbox(t, ctx, env, "docker.io/branchbox/busybox:test", "sleep", "100000")
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1, Pids: 1})
	if err != nil {
		t.Fatal(err)
	}
	p, err := sc.Exec(ctx, kids[0].ID, client.ExecOptions{Args: []string{"true"}})
	if err == nil {
		_, _ = p.Wait(ctx)
		t.Fatal("exec into a branch at its process limit: not refused")
	}
	if !errdefs.IsResourceExhausted(err) || strings.Contains(err.Error(), "\n") ||
		!strings.Contains(err.Error(), "branch "+kids[0].ID+"'s process limit (pids.max 1) is reached") {
		t.Fatalf("exec into a branch at its process limit: %v; want one line naming the limit, resource exhausted", err)
	}
}
