//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// sandboxCtxEnv runs the sandbox "sb" (runtime io.containerd.branch.v1,
// snapshotter branch) with a process that keeps running, and returns a
// branch client for it.
func sandboxCtxEnv(t *testing.T, extra ...string) (context.Context, *daemons.Env, *client.SandboxClient) {
	t.Helper()
	ctx, env, _ := shimEnv(t)
	args := append([]string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch"}, extra...)
	args = append(args, ociimage.ImageRef, "sb", "sh", "-c", "echo before > /state; exec sleep 100000")
	if _, err := env.Ctr(ctx, args...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb") })
	waitFor(t, func() bool { out, _ := execIn(ctx, env, "sb", "cat", "/state"); return out == "before\n" })
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return ctx, env, sc
}

// runSandbox runs the sandbox "sb" of image with the command args, as
// `ctr run -d` does, and returns a branch client for it; both go when
// the test ends.
func runSandbox(t *testing.T, ctx context.Context, env *daemons.Env, image string, args ...string) *client.SandboxClient {
	t.Helper()
	return runSandboxWith(t, ctx, env, nil, image, args...)
}

// runSandboxWith is runSandbox with more flags of ctr run.
func runSandboxWith(t *testing.T, ctx context.Context, env *daemons.Env, flags []string, image string, args ...string) *client.SandboxClient {
	t.Helper()
	run := append(append([]string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch"}, flags...), image, "sb")
	run = append(run, args...)
	if _, err := env.Ctr(ctx, run...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb") })
	return sandboxClient(t, ctx, env, "sb")
}

// sandboxClient is a branch client for sandbox id, closed when the test
// ends.
func sandboxClient(t *testing.T, ctx context.Context, env *daemons.Env, id string) *client.SandboxClient {
	t.Helper()
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

// run runs a command in a branch and returns its output (stdout and
// stderr) and exit code; a failure to run it at all fails the test.
func run(t *testing.T, ctx context.Context, sc *client.SandboxClient, b string, args ...string) (string, int) {
	t.Helper()
	out, st, err := runErr(ctx, sc, b, args...)
	if err != nil {
		t.Fatalf("run %v in %s: %v", args, b, err)
	}
	return out, st.Code
}

func runErr(ctx context.Context, sc *client.SandboxClient, b string, args ...string) (string, client.ExitStatus, error) {
	var out client.Output
	st, err := sc.Run(ctx, b, client.ExecOptions{Args: args, Stdout: &out, Stderr: &out})
	return out.String(), st, err
}

// sandboxTask is the containerd task of the sandbox container id, and the
// client it came through, closed when the test ends.
func sandboxTask(t *testing.T, ctx context.Context, env *daemons.Env, id string) (*containerd.Client, containerd.Task) {
	t.Helper()
	cc, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctr, err := cc.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cc, task
}

func mustRun(t *testing.T, ctx context.Context, sc *client.SandboxClient, b string, args ...string) string {
	t.Helper()
	out, code := run(t, ctx, sc, b, args...)
	if code != 0 {
		t.Fatalf("%v in branch %s: exit %d: %s", args, b, code, out)
	}
	return out
}

func fork(t *testing.T, ctx context.Context, sc *client.SandboxClient, opts client.ForkOptions) []client.BranchInfo {
	t.Helper()
	kids, err := sc.Fork(ctx, opts)
	if err != nil {
		t.Fatalf("fork %+v: %v", opts, err)
	}
	if len(kids) != opts.Count {
		t.Fatalf("fork made %d branches, want %d", len(kids), opts.Count)
	}
	return kids
}

// branchProcs lists, from the host, the live processes of a branch: those
// in its cgroup (or below) on any hierarchy, and those in its PID namespace.
func branchProcs(env *daemons.Env, info client.BranchInfo) []hostProc {
	id := strings.TrimPrefix(info.Cgroup, "/"+env.Namespace+"/")
	return containerHostProcs(env.Namespace, id, info.InitPid)
}

// TestContextsForkExecCommit is the core cycle: a running sandbox forks
// two branches with running inits; each sees the sandbox's files as of the
// fork and writes privately; the sandbox keeps running with a read-only
// rootfs; the first commit wins, its files show up at once in the
// sandbox's running processes, the loser's processes are gone, and any
// call on the loser fails stale, naming the winner.
func TestContextsForkExecCommit(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	a, b := kids[0], kids[1]
	for _, k := range kids {
		if k.InitPid == 0 || k.Status != "waiting" {
			t.Fatalf("branch %s: init pid %d, status %q; want a waiting init", k.ID, k.InitPid, k.Status)
		}
		if got := mustRun(t, ctx, sc, k.ID, "cat", "/state"); got != "before\n" {
			t.Fatalf("branch %s sees /state %q, want the sandbox's", k.ID, got)
		}
	}
	// The sandbox runs on, sealed.
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "exec 2>&1; echo x > /state"); err == nil || !strings.Contains(out, "Read-only file system") {
		t.Fatalf("write in the sealed sandbox: %q %v; want EROFS", out, err)
	}
	mustRun(t, ctx, sc, a.ID, "sh", "-c", "echo from-a > /state && echo a > /only-a")
	mustRun(t, ctx, sc, b.ID, "sh", "-c", "echo from-b > /state && echo b > /only-b")
	if out, code := run(t, ctx, sc, b.ID, "cat", "/only-a"); code == 0 {
		t.Fatalf("branch b sees a's file: %q", out)
	}
	// A process left running in the loser, to be killed by the commit.
	bg, err := sc.Exec(ctx, b.ID, client.ExecOptions{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	bgDone := make(chan client.ExitStatus, 1)
	go func() {
		st, err := bg.Wait(ctx)
		if err != nil {
			t.Errorf("wait for the loser's process: %v", err)
		}
		bgDone <- st
	}()
	loserProcs := branchProcs(env, b)
	if len(loserProcs) < 2 {
		t.Fatalf("loser's processes seen from the host: %v", loserProcs)
	}
	res, err := sc.Commit(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Invalidated) != 1 || res.Invalidated[0] != b.ID {
		t.Fatalf("invalidated %v, want [%s]", res.Invalidated, b.ID)
	}
	if st := <-bgDone; st.Code != 137 {
		t.Fatalf("loser's process ended %+v; want killed (137)", st)
	}
	// The sandbox's running processes see the commit, and it is writable.
	if out, err := execIn(ctx, env, "sb", "cat", "/state", "/only-a"); err != nil || out != "from-a\na\n" {
		t.Fatalf("sandbox after commit: %q %v", out, err)
	}
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo after > /state"); err != nil {
		t.Fatalf("sandbox not writable after commit: %v", err)
	}
	// Nothing of either branch is left on the host.
	assertBranchGone(t, env, a, nil)
	assertBranchGone(t, env, b, loserProcs)
	_, _, err = runErr(ctx, sc, b.ID, "true")
	var se *branch.StaleError
	if !errors.As(err, &se) || se.Winner != a.ID || !errdefs.IsAborted(err) {
		t.Fatalf("exec in the loser: %v; want a stale error naming %s", err, a.ID)
	}
	if _, err := sc.Commit(ctx, b.ID); !errors.As(err, &se) {
		t.Fatalf("commit of the loser: %v; want stale", err)
	}
	if _, err := sc.Abort(ctx, b.ID); !errors.As(err, &se) {
		t.Fatalf("abort of the loser: %v; want stale", err)
	}
}

// assertBranchGone checks from the host that no process of a branch is
// alive, its cgroup is gone on every hierarchy, its rootfs is unmounted and
// its runtime state removed. Its processes are dead when the commit or
// abort that ended it returns; the rest is removed in the background just
// after, so all of it is waited for, up to 10 seconds.
func assertBranchGone(t *testing.T, env *daemons.Env, info client.BranchInfo, procs []hostProc) {
	t.Helper()
	var (
		left  []hostProc
		dirs  []string
		state bool
	)
	bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb", "branches", info.ID)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left = append(survivors(procs), branchProcs(env, info)...)
		dirs, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", info.Cgroup))
		if d := filepath.Join("/sys/fs/cgroup", info.Cgroup); isDirPath(d) {
			dirs = append(dirs, d)
		}
		_, err := os.Stat(filepath.Join(runtimeRoot, env.Namespace, "sb.b"+info.ID))
		state = err == nil
		if len(left) == 0 && len(dirs) == 0 && !state {
			break
		}
	}
	if len(left) != 0 {
		t.Errorf("processes of branch %s survive: %v", info.ID, left)
	}
	if len(dirs) != 0 {
		t.Errorf("cgroups of branch %s left: %v", info.ID, dirs)
	}
	if m, _ := daemons.MountsUnder(bundle); len(m) != 0 {
		t.Errorf("mounts of branch %s left: %v", info.ID, m)
	}
	if state {
		t.Errorf("runtime state of branch %s left", info.ID)
	}
}

func isDirPath(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// branchctl runs the branchctl binary against the env (address and
// namespace from the environment, as users set them) and returns its
// stdout, stderr and exit code.
func branchctl(t *testing.T, ctx context.Context, env *daemons.Env, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "branchctl"), args...)
	cmd.Env = append(os.Environ(), "CONTAINERD_ADDRESS="+env.Address, "CONTAINERD_NAMESPACE="+env.Namespace)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("branchctl %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

// TestBranchctl drives the command line end to end: fork (JSON), exec with
// stdin, exit code and a terminal, tree, commit, the stale error of a
// loser with its hint, abort, and the errors for bad input.
func TestBranchctl(t *testing.T) {
	ctx, env, _ := sandboxCtxEnv(t)
	out, errOut, code := branchctl(t, ctx, env, "", "fork", "sb", "-n", "3", "--json")
	if code != 0 {
		t.Fatalf("fork: %d %s", code, errOut)
	}
	var kids []client.BranchInfo
	if err := json.Unmarshal([]byte(out), &kids); err != nil || len(kids) != 3 {
		t.Fatalf("fork --json: %v %q", err, out)
	}
	ref := func(i int) string { return "sb/" + kids[i].ID }
	out, _, code = branchctl(t, ctx, env, "hello\n", "exec", ref(0), "--", "sh", "-c", "read x; echo got $x > /answer; cat /answer; exit 3")
	if code != 3 || out != "got hello\n" {
		t.Fatalf("exec with stdin: code %d out %q; want 3 and the answer", code, out)
	}
	out, _, code = branchctl(t, ctx, env, "", "exec", "-t", ref(1), "--", "tty")
	if code != 0 || !strings.HasPrefix(out, "/dev/pts/") {
		t.Fatalf("exec -t: code %d out %q; want a pty", code, out)
	}
	out, _, code = branchctl(t, ctx, env, "", "tree", "sb")
	for _, want := range []string{"sb (0)", "└─ " + kids[0].ID, "waiting"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("tree: code %d, no %q in\n%s", code, want, out)
		}
	}
	out, _, code = branchctl(t, ctx, env, "", "abort", ref(2))
	if code != 0 || !strings.Contains(out, "aborted "+kids[2].ID) {
		t.Fatalf("abort: %d %q", code, out)
	}
	out, errOut, code = branchctl(t, ctx, env, "", "commit", ref(0), "--json")
	var res client.SandboxCommitResult
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Invalidated) != 1 || res.Invalidated[0] != kids[1].ID {
		t.Fatalf("commit: %d %q %s", code, out, errOut)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/answer"); err != nil || out != "got hello\n" {
		t.Fatalf("sandbox after commit: %q %v", out, err)
	}
	_, errOut, code = branchctl(t, ctx, env, "", "exec", ref(1), "--", "true")
	if code != 1 || !strings.Contains(errOut, "branch "+kids[0].ID+" committed first") || !strings.Contains(errOut, "hint: ") {
		t.Fatalf("exec in the loser: %d %q; want a stale error naming the winner, and a hint", code, errOut)
	}
	out, _, code = branchctl(t, ctx, env, "", "tree", "sb", "--json")
	var nodes []client.BranchInfo
	if code != 0 || json.Unmarshal([]byte(out), &nodes) != nil {
		t.Fatalf("tree --json: %d %q", code, out)
	}
	states := map[string]branch.State{}
	for _, n := range nodes {
		states[n.ID] = n.State
	}
	if states["0"] != branch.Live || states[kids[0].ID] != branch.Committed || states[kids[1].ID] != branch.Stale || states[kids[2].ID] != branch.Aborted {
		t.Fatalf("tree states %v", states)
	}
	// Bad input says what was wrong and what to do.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"commit", "sb"}, "names no branch"},
		{[]string{"exec", "sb/1"}, "no command"},
		{[]string{"exec", "sb", "--", "true"}, "use nerdctl exec or ctr tasks exec"},
		{[]string{"exec", "sb/0", "--", "true"}, "branchctl runs commands in its branches"},
		{[]string{"tree", "nosuch"}, "no sandbox \"nosuch\": no container has that id, id prefix or name"},
		{[]string{"tree", "nosuch"}, "hint: see the sandboxes of namespace"},
		{[]string{"fork", "sb", "-n", "1", "--seal", "glue"}, "want \"ro\" or \"freeze\""},
		{[]string{"--address", "/nonexistent.sock", "tree", "sb"}, "does not answer"},
		{[]string{"frobnicate"}, "unknown command"},
	} {
		_, errOut, code := branchctl(t, ctx, env, "", tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("branchctl %v: code %d, stderr %q; want %q", tc.args, code, errOut, tc.want)
		}
	}
	// A container on another runtime is refused, naming the runtime.
	if _, err := env.Ctr(ctx, "run", "-d", "--snapshotter", "overlayfs", ociimage.ImageRef, "plain", "sleep", "1000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "plain") })
	_, errOut, code = branchctl(t, ctx, env, "", "fork", "plain", "-n", "1")
	if code == 0 || !strings.Contains(errOut, "runs on runtime io.containerd.runc.v2") {
		t.Fatalf("fork of a runc-v2 container: %d %q", code, errOut)
	}
}
