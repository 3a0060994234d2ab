//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// replScript is a small REPL in the image's shell: its state is in shell
// variables only (k, the next command's number, and whatever commands
// set); it runs /dev/shm/cmd.K when it appears, writing /dev/shm/out.K,
// and holds /data.log open for append on descriptor 3. /dev/shm is a tmpfs
// of the container's own, which a memory fork copies and a commit does not
// carry: each branch's commands and outputs stay its own.
const replScript = `echo before > /data.log; exec 3>>/data.log; k=0
while :; do
  if [ -f /dev/shm/cmd.$k ]; then
    . /dev/shm/cmd.$k > /dev/shm/out.$k.tmp 2>&1; mv /dev/shm/out.$k.tmp /dev/shm/out.$k; k=$((k+1))
  fi
  sleep 0.02
done`

// replSandbox runs replScript as the sandbox "sb" and returns a client.
func replSandbox(t *testing.T) (context.Context, *daemons.Env, *client.SandboxClient) {
	t.Helper()
	return replSandboxWith(t, daemons.Config{})
}

// replSandboxWith is replSandbox on daemons started with cfg.
func replSandboxWith(t *testing.T, cfg daemons.Config) (context.Context, *daemons.Env, *client.SandboxClient) {
	t.Helper()
	ctx, env, _ := shimEnvWith(t, cfg)
	sc := runSandbox(t, ctx, env, ociimage.ImageRef, "sh", "-c", replScript)
	waitFor(t, func() bool { out, _ := execIn(ctx, env, "sb", "cat", "/data.log"); return out == "before\n" })
	waitReplReady(t, ctx, env, "sb")
	return ctx, env, sc
}

// waitReplReady waits until the replScript of sandbox id holds /data.log
// open: a fork before that seals the rootfs read-only, its exec 3>> fails,
// and the shell exits (a failed redirection of exec ends a script).
func waitReplReady(t *testing.T, ctx context.Context, env *daemons.Env, id string) {
	t.Helper()
	_, task := sandboxTask(t, namespaces.WithNamespace(ctx, env.Namespace), env, id)
	waitUntil(t, "the REPL to open /data.log", 10*time.Second, func() bool {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", task.Pid()))
		return err == nil && strings.HasSuffix(l, "/data.log")
	})
}

// replIn runs one REPL command (a line of shell) in a branch: the sandbox
// ("0", through the runtime's exec) or a branch, and returns its output.
func replIn(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, b string, k int, line string) string {
	t.Helper()
	// Written whole, then renamed: the REPL must not find it half written.
	write := fmt.Sprintf("cat > /dev/shm/.cmd <<'EOF'\n%s\nEOF\nmv /dev/shm/.cmd /dev/shm/cmd.%d", line, k)
	read := []string{"cat", fmt.Sprintf("/dev/shm/out.%d", k)}
	var out string
	if b == branch.RootID {
		if o, err := execIn(ctx, env, "sb", "sh", "-c", write); err != nil {
			t.Fatalf("sandbox: write command %d: %v: %s", k, err, o)
		}
		waitUntil(t, fmt.Sprintf("sandbox: output of command %d", k), 10*time.Second, func() bool {
			o, err := execIn(ctx, env, "sb", read...)
			out = o
			return err == nil
		})
		return out
	}
	mustRun(t, ctx, sc, b, "sh", "-c", write)
	waitUntil(t, fmt.Sprintf("branch %s: output of command %d", b, k), 10*time.Second, func() bool {
		o, code := run(t, ctx, sc, b, read...)
		out = o
		return code == 0
	})
	return out
}

// TestMemoryFork forks a running sandbox's processes: each branch's REPL
// continues from the sandbox's state at the fork (a variable only its
// memory held, its command counter, its descriptor open for append on the
// rootfs), diverges on its own, and the usual guarantees hold: first
// commit wins, the loser's processes are killed, the sandbox sees the
// winner's files and keeps its own processes, nothing is left behind.
func TestMemoryFork(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	secret := strings.TrimSpace(replIn(t, ctx, env, sc, branch.RootID, 0, `mem=v$RANDOM$RANDOM; echo $mem`))
	if secret == "" {
		t.Fatal("the REPL printed no value")
	}
	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 2, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork: %v", err)
	}
	if len(res.Branches) != 2 || res.Memory == nil || res.Memory.ImageBytes == 0 || res.Memory.Pause <= 0 {
		t.Fatalf("memory fork: %+v, figures %+v", res.Branches, res.Memory)
	}
	t.Logf("memory fork of 2: parent stopped %s, dump %s, restore %s, image %d bytes", res.Memory.Pause, res.Memory.Dump, res.Memory.Restore, res.Memory.ImageBytes)
	a, b := res.Branches[0], res.Branches[1]
	for _, k := range res.Branches {
		if !k.MemoryFork || k.Status != "running" || k.InitPid == 0 {
			t.Fatalf("branch %s: memory %v, status %q, init %d", k.ID, k.MemoryFork, k.Status, k.InitPid)
		}
		// Its processes are in its own cgroup, on every hierarchy.
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", k.InitPid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
			if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && parts[1] != "" && parts[2] != k.Cgroup && !strings.HasPrefix(parts[2], k.Cgroup+"/") {
				t.Fatalf("branch %s's init is in cgroup %s, not its own %s", k.ID, line, k.Cgroup)
			}
		}
		if got := replIn(t, ctx, env, sc, k.ID, 1, `echo "mem=$mem k=$k"`); got != fmt.Sprintf("mem=%s k=1\n", secret) {
			t.Fatalf("branch %s continues with %q, want the sandbox's state (mem=%s k=1)", k.ID, got, secret)
		}
	}
	// They diverge, each in its own memory and its own copy of the file
	// the REPL appends to.
	for _, k := range res.Branches {
		replIn(t, ctx, env, sc, k.ID, 2, fmt.Sprintf(`mem=from-%s; echo $mem >&3`, k.ID))
	}
	for _, k := range res.Branches {
		if got := replIn(t, ctx, env, sc, k.ID, 3, `echo $mem`); got != "from-"+k.ID+"\n" {
			t.Fatalf("branch %s: mem %q after its own change", k.ID, got)
		}
		if got := mustRun(t, ctx, sc, k.ID, "cat", "/data.log"); got != "before\nfrom-"+k.ID+"\n" {
			t.Fatalf("branch %s: /data.log %q", k.ID, got)
		}
	}
	loser := branchProcs(env, b)
	if len(loser) == 0 {
		t.Fatal("the loser's processes are not seen from the host")
	}
	cr, err := sc.Commit(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(cr.Invalidated) != 1 || cr.Invalidated[0] != b.ID {
		t.Fatalf("invalidated %v, want [%s]", cr.Invalidated, b.ID)
	}
	assertBranchGone(t, env, a, nil)
	assertBranchGone(t, env, b, loser)
	var se *branch.StaleError
	if _, _, err := runErr(ctx, sc, b.ID, "true"); !errors.As(err, &se) || se.Winner != a.ID {
		t.Fatalf("exec in the loser: %v; want stale naming %s", err, a.ID)
	}
	// The sandbox has the winner's files and its own processes, which
	// were stopped only for the dump: its memory is as it was.
	if out, err := execIn(ctx, env, "sb", "cat", "/data.log"); err != nil || out != "before\nfrom-"+a.ID+"\n" {
		t.Fatalf("sandbox's /data.log after the commit: %q %v", out, err)
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 1, `echo "mem=$mem k=$k"`); got != fmt.Sprintf("mem=%s k=1\n", secret) {
		t.Fatalf("sandbox after the commit: %q, want its own state", got)
	}
	assertNoMemoryImages(t, env)
}

// TestMemoryForkStop: a sandbox killed while it has memory branches (its
// processes frozen by the seal, as the REPL's open file makes them) ends
// with every branch's processes, as with any branch.
func TestMemoryForkStop(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testForkStop(t, client.ForkOptions{Count: 2, WithMemory: true}) })
	// The same stop of a sandbox frozen by a plain fork's seal.
	t.Run("plain", func(t *testing.T) { testForkStop(t, client.ForkOptions{Count: 2, Seal: "freeze"}) })
}

func testForkStop(t *testing.T, opts client.ForkOptions) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=1`)
	kids, err := sc.Fork(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	var procs []hostProc
	for _, k := range kids {
		procs = append(procs, branchProcs(env, k)...)
	}
	if len(procs) < 2 {
		t.Fatalf("branches' processes seen from the host: %v", procs)
	}
	_, task := sandboxTask(t, ctx, env, "sb")
	wait, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Kill(ctx, 9); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wait:
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox did not exit within 30s of SIGKILL")
	}
	for _, k := range kids {
		assertBranchGone(t, env, k, procs)
	}
}

// TestMemoryForkRefusals: what a memory fork cannot carry is refused
// before anything changes, naming the process and the resource: a
// listener, a connection, a nested user namespace, a command.
func TestMemoryForkRefusals(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	// A listener the branches could not bind beside the sandbox's.
	replIn(t, ctx, env, sc, branch.RootID, 0, `nc -l -p 8123 >/dev/null 2>&1 & echo started`)
	waitUntil(t, "the listener", 10*time.Second, func() bool {
		_, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
		return err != nil && strings.Contains(err.Error(), "listens on TCP port 8123")
	})
	_, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "(nc)") {
		t.Fatalf("memory fork with a listener: %v; want failed precondition naming nc and the port", err)
	}
	// A connection, both ends in the sandbox (each nc's input held open,
	// or busybox's nc ends it at once): read from the processes' own
	// descriptors, each end named.
	replIn(t, ctx, env, sc, branch.RootID, 1, `sleep 1000 | nc -l -p 8126 >/dev/null 2>&1 & sleep 0.2; sleep 1000 | nc 127.0.0.1 8126 >/dev/null 2>&1 & echo started`)
	waitUntil(t, "the connection", 10*time.Second, func() bool {
		_, err = sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
		return err != nil && strings.Contains(err.Error(), "to port 8126, which cannot be copied")
	})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "has a TCP connection from port 8126 to port ") {
		t.Fatalf("memory fork with a connection: %v; want failed precondition naming both of its ends", err)
	}
	// A process in a user namespace of its own (unshare, bubblewrap, a
	// browser's sandbox): CRIU failed the dump on it after stopping the
	// processes ("Can't dump nested user namespace").
	replIn(t, ctx, env, sc, branch.RootID, 2, `unshare -U -r sleep 1000 & echo started`)
	waitUntil(t, "the nested user namespace", 10*time.Second, func() bool {
		_, err = sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
		return err != nil && strings.Contains(err.Error(), "(sleep) is in a user namespace of its own")
	})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("memory fork with a nested user namespace: %v; want failed precondition", err)
	}
	for _, o := range []client.ForkOptions{
		{Count: 1, WithMemory: true, Args: []string{"true"}},
	} {
		if _, err := sc.ForkResult(ctx, o); err == nil {
			t.Fatalf("memory fork %+v succeeded; want refused", o)
		}
	}
	// Nothing changed: no branch, the sandbox unsealed, writable.
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(tree) != 1 || tree[0].Sealed {
		t.Fatalf("after refused memory forks the tree is %+v", tree)
	}
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "echo x > /x"); err != nil {
		t.Fatalf("sandbox not writable after refused forks: %v %s", err, out)
	}
	assertNoMemoryImages(t, env)
}

// assertNoMemoryImages checks that no memory fork left its image in the
// sandbox's bundle.
func assertNoMemoryImages(t *testing.T, env *daemons.Env) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb", ".memory-fork-*"))
	if len(left) > 0 {
		t.Fatalf("memory images left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb")); err != nil {
		t.Fatalf("the sandbox's bundle: %v (the check looks in the wrong place)", err)
	}
}

// TestMemoryForkUser forks a sandbox whose processes run as a user (ctr
// run --user, a Dockerfile's USER, a pod's runAsUser): the copies run as
// that user, with the same resource limits, and continue from its memory.
// CRIU read a task's limits with prlimit(), which the kernel refuses root
// on another user's task without CAP_SYS_RESOURCE (as on these VMs): the
// fork failed with "Can't get rlimit 0" (hack/criu/0005).
func TestMemoryForkUser(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	// A value only the shell's memory holds, written again and again to a
	// file of the user's.
	sc := runSandboxWith(t, ctx, env, []string{"--user", "1000:1000"}, ociimage.ImageRef, "sh", "-c",
		`v=v$RANDOM$RANDOM; while :; do echo "$v $(id -u)" > /tmp/v; sleep 0.05; done`)
	_, task := sandboxTask(t, namespaces.WithNamespace(ctx, env.Namespace), env, "sb")
	var want string
	waitUntil(t, "the sandbox's value", 10*time.Second, func() bool {
		out, err := execIn(ctx, env, "sb", "cat", "/tmp/v")
		want = out
		return err == nil && strings.HasSuffix(out, " 1000\n")
	})
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", task.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork of a sandbox run as uid 1000: %v", err)
	}
	k := kids[0]
	// The branch's copy writes the sandbox's value to its own file.
	mustRun(t, ctx, sc, k.ID, "rm", "/tmp/v")
	waitUntil(t, "the branch's shell to write its value", 10*time.Second, func() bool {
		out, code := run(t, ctx, sc, k.ID, "cat", "/tmp/v")
		return code == 0 && out == want
	})
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", k.InitPid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), "\nUid:\t1000\t1000\t1000\t1000\n") || !strings.Contains(string(st), "\nGid:\t1000\t1000\t1000\t1000\n") {
		t.Fatalf("branch %s's restored shell's ids:\n%s", k.ID, st)
	}
	if got, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", k.InitPid)); err != nil || string(got) != string(limits) {
		t.Fatalf("branch %s's restored shell's limits (%v):\n%s\nthe sandbox's:\n%s", k.ID, err, got, limits)
	}
	if _, err := sc.Abort(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, k, nil)
	assertNoMemoryImages(t, env)
}

// TestMemoryForkBackgroundJob forks a shell with a job running in the
// background: in each branch the job runs on, as the shell's child, and
// writes to the branch's own files.
func TestMemoryForkBackgroundJob(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `(while :; do echo tick >> /dev/shm/ticks; sleep 0.05; done) & job=$!; echo started`)
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 2, WithMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if got := replIn(t, ctx, env, sc, k.ID, 1, `kill -0 $job && echo "job $job alive"`); !strings.HasPrefix(got, "job ") || !strings.HasSuffix(got, " alive\n") {
			t.Fatalf("branch %s: the shell's background job: %q", k.ID, got)
		}
		count := func() int {
			out := mustRun(t, ctx, sc, k.ID, "cat", "/dev/shm/ticks")
			return strings.Count(out, "tick")
		}
		n := count()
		waitUntil(t, "the job ticking in branch "+k.ID, 10*time.Second, func() bool { return count() > n+2 })
	}
	for _, k := range kids {
		if _, err := sc.Abort(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
		assertBranchGone(t, env, k, nil)
	}
	assertNoMemoryImages(t, env)
}

// TestMemoryForkIsolated: a memory fork with --net isolated gives each
// branch a network namespace of its own, in which the parent's listener
// is restored and answers on the same port, beside the parent's own; the
// namespace goes with the branch.
func TestMemoryForkIsolated(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=served; nc -ll -p 8125 -e echo pong >/dev/null 2>&1 & echo started`)
	// Shared, the listener is refused; the wait is for it to listen.
	waitUntil(t, "the listener", 10*time.Second, func() bool {
		_, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
		return err != nil && strings.Contains(err.Error(), "listens on TCP port 8125")
	})
	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 2, WithMemory: true, Net: "isolated"})
	if err != nil {
		t.Fatalf("memory fork --net isolated of a sandbox with a listener: %v", err)
	}
	parentNet, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", sandboxInitPid(t, ctx, sc)))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range res.Branches {
		if k.Net != "isolated" || !k.MemoryFork {
			t.Fatalf("branch %+v", k)
		}
		if got := replIn(t, ctx, env, sc, k.ID, 1, `echo "mem=$mem"`); got != "mem=served\n" {
			t.Fatalf("branch %s continues with %q", k.ID, got)
		}
		if got := mustRun(t, ctx, sc, k.ID, "nc", "127.0.0.1", "8125"); got != "pong\n" {
			t.Fatalf("branch %s: its restored listener answers %q", k.ID, got)
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", k.InitPid)); err != nil || ns == parentNet {
			t.Fatalf("branch %s's network namespace %q %v, the parent's %q", k.ID, ns, err, parentNet)
		}
	}
	a, b := res.Branches[0], res.Branches[1]
	loser := branchProcs(env, b)
	if _, err := sc.Commit(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, a, nil)
	assertBranchGone(t, env, b, loser)
	// The sandbox's own listener (frozen with it by the seal while it had
	// branches: the REPL holds a file open for writing) answers again.
	if out, err := execIn(ctx, env, "sb", "nc", "127.0.0.1", "8125"); err != nil || out != "pong\n" {
		t.Fatalf("the sandbox's own listener after the commit: %q %v", out, err)
	}
	assertNoMemoryImages(t, env)
}

// TestMemoryForkSubCgroup: a sandbox whose processes are not all in its
// own cgroup is dumped and restored with CRIU's cgroup handling
// (shim/ocirt/cgroupmode.go skips it only for a flat tree): a process the
// host put in a sub-cgroup of the sandbox's is restored in the same
// sub-cgroup of the branch's, and the branch's end leaves no cgroup.
func TestMemoryForkSubCgroup(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", ociimage.ImageRef, "sb",
		"sh", "-c", "sleep 100000 & touch /dev/shm/ready; wait"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb") })
	waitFor(t, func() bool { _, err := execIn(ctx, env, "sb", "test", "-f", "/dev/shm/ready"); return err == nil })
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "sb")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	tree, err := sc.Tree(ctx)
	if err != nil || len(tree) == 0 {
		t.Fatalf("tree: %v %v", tree, err)
	}
	root := tree[0]
	sleeper := onlyChild(t, root.InitPid)
	// The pids hierarchy (v1) or the unified one (v2): where the sleeper
	// is, a sub-cgroup "sub" it is moved into.
	dir, ok := "", false
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sleeper))
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[1] == "pids":
			dir, ok = filepath.Join("/sys/fs/cgroup/pids", parts[2]), true
		case parts[1] == "" && !ok && isDirPath(filepath.Join("/sys/fs/cgroup", parts[2])) && !isDirPath("/sys/fs/cgroup/pids"):
			dir, ok = filepath.Join("/sys/fs/cgroup", parts[2]), true
		}
	}
	if !ok {
		t.Fatalf("no pids or unified cgroup in %q", cg)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "cgroup.procs"), []byte(strconv.Itoa(sleeper)), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork: %v", err)
	}
	k := res.Branches[0]
	copied := onlyChild(t, k.InitPid)
	got, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", copied))
	want := k.Cgroup + "/sub"
	if !strings.Contains(string(got), ":"+want+"\n") {
		t.Fatalf("the sleeper's copy in branch %s is in\n%s\nnot in %s", k.ID, got, want)
	}
	procs := branchProcs(env, k)
	if _, err := sc.Abort(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, k, procs)
	if dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", want)); len(dirs) != 0 {
		t.Fatalf("the branch's sub-cgroups are left: %v", dirs)
	}
}

// onlyChild is the one child of pid, waited for.
func onlyChild(t *testing.T, pid int) int {
	t.Helper()
	var child int
	waitUntil(t, fmt.Sprintf("the child of %d", pid), 10*time.Second, func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		f := strings.Fields(string(b))
		if len(f) != 1 {
			return false
		}
		child, _ = strconv.Atoi(f[0])
		return child > 0
	})
	return child
}

// TestMemoryForkSharedPidNS: a sandbox whose processes run in a PID
// namespace it joins (another container's, as nerdctl --pid container:X
// or a pod with shareProcessNamespace make it), whose init is not theirs:
// CRIU can restore no such tree as a branch's own namespace. Its memory
// fork and checkpoint with memory are refused before anything changes,
// naming the namespace (before, CRIU stopped the processes, then failed:
// "Can't dump a pid namespace without the process init"); a fork of its
// files works.
func TestMemoryForkSharedPidNS(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "docker.io/branchbox/busybox:test", "holder", "sleep", "100000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "holder") })
	_, holder := sandboxTask(t, ctx, env, "holder")
	pidns := fmt.Sprintf("pid:/proc/%d/ns/pid", holder.Pid())
	sc := runSandboxWith(t, ctx, env, []string{"--with-ns", pidns}, "docker.io/branchbox/busybox:test", "sh", "-c", "echo before > /state; exec sleep 100000")
	for _, try := range []func() error{
		func() error { _, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true}); return err },
		func() error { _, err := sc.Checkpoint(ctx, "", "c", client.CheckpointWithMemory()); return err },
	} {
		err := try()
		if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "PID namespace that is not theirs, one it joins") {
			t.Fatalf("memory fork or checkpoint of a sandbox in another's PID namespace: %v; want not implemented, naming the namespace", err)
		}
	}
	tree, err := sc.Tree(ctx)
	if err != nil || len(tree) != 1 || tree[0].Sealed {
		t.Fatalf("after the refusals: %+v %v; want the sandbox alone, unsealed", tree, err)
	}
	assertNoMemoryImages(t, env)
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	if out := mustRun(t, ctx, sc, kid.ID, "cat", "/state"); out != "before\n" {
		t.Fatalf("the branch's /state: %q", out)
	}
}

// TestMemoryForkDeletedFiles: a process holding deleted files open (a
// Python tempfile.TemporaryFile, SQLite's temporary files), on the rootfs
// and on a tmpfs. CRIU carries their content in the image ("ghost files"),
// by default only up to 1 MiB each: before, a memory fork of a process
// holding a 3 MiB one failed after stopping it ("Can't dump ghost file
// /tmp/big of 3145728 size, increase limit"). Now each copy has them, same
// content; one above the memory fork's limit (64 MiB) is refused before the
// dump, naming the process, the file and the sizes.
func TestMemoryForkDeletedFiles(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	sc := runSandbox(t, ctx, env, ociimage.ImageRef, "sh", "-c", `dd if=/dev/urandom of=/tmp/big bs=1M count=3 2>/dev/null
exec 5</tmp/big; rm /tmp/big
dd if=/dev/urandom of=/dev/shm/big2 bs=1M count=2 2>/dev/null
exec 6</dev/shm/big2; rm /dev/shm/big2
md5sum /proc/self/fd/5 /proc/self/fd/6 | cut -d' ' -f1 > /dev/shm/sums
while [ ! -e /dev/shm/go ]; do sleep 0.1; done
dd if=/dev/zero of=/tmp/huge bs=1M count=65 2>/dev/null
exec 7</tmp/huge; rm /tmp/huge; echo held > /dev/shm/held
exec sleep 100000`)
	waitUntil(t, "the sandbox's deleted files", 10*time.Second, func() bool {
		out, err := execIn(ctx, env, "sb", "sh", "-c", "wc -l < /dev/shm/sums")
		return err == nil && strings.TrimSpace(out) == "2"
	})
	want, _ := execIn(ctx, env, "sb", "cat", "/dev/shm/sums")
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2, WithMemory: true})
	for _, k := range kids {
		if got := mustRun(t, ctx, sc, k.ID, "sh", "-c", "md5sum /proc/1/fd/5 /proc/1/fd/6 | cut -d' ' -f1"); got != want {
			t.Errorf("deleted files held by branch %s's init: %q; want the sandbox's %q", k.ID, got, want)
		}
		if _, err := sc.Abort(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Over the limit: a 65 MiB deleted file.
	if _, err := execIn(ctx, env, "sb", "touch", "/dev/shm/go"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the huge file held and deleted", 20*time.Second, func() bool {
		_, err := execIn(ctx, env, "sb", "test", "-e", "/dev/shm/held")
		return err == nil
	})
	_, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "holds the deleted file /tmp/huge open (descriptor 7), of 65MiB, and a memory fork carries deleted files of at most 64MiB") {
		t.Fatalf("memory fork holding a 65 MiB deleted file: %v; want failed precondition naming it", err)
	}
	assertNoMemoryImages(t, env)
}

// TestMemoryForkSymlinkBind: a bind mount whose source is a symlink
// (nerdctl -v /lib64:/lib64 on a merged-/usr host, where /lib64 links to
// usr/lib64, as a Node.js sandbox borrowing the host's libraries has it).
// The container's mount followed the link; CRIU's restore did not ("mnt-v2:
// Failed to move_mount from /lib64 ...: Invalid argument"), and every
// memory fork of such a sandbox failed. The copies see the bound files.
func TestMemoryForkSymlinkBind(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "real", "f"), []byte("through the link\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	sc := runSandboxWith(t, ctx, env, []string{"--mount", "type=bind,src=" + filepath.Join(dir, "link") + ",dst=/data,options=rbind:ro"},
		ociimage.ImageRef, "sh", "-c", "exec 3</data/f; exec sleep 100000")
	waitUntil(t, "the sandbox's bind", 10*time.Second, func() bool {
		out, err := execIn(ctx, env, "sb", "cat", "/data/f")
		return err == nil && out == "through the link\n"
	})
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1, WithMemory: true})[0]
	if out := mustRun(t, ctx, sc, kid.ID, "sh", "-c", "cat /data/f; cat /proc/1/fd/3"); out != "through the link\nthrough the link\n" {
		t.Fatalf("the memory branch's bind and its init's descriptor on it: %q", out)
	}
}
