//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ops"
)

// TestExecCanceledMidStart: an exec whose caller's context ends while it
// starts leaves no process and no FIFO behind, through the Go client (a
// branch) and through ops.Exec (the HTTP API's and the MCP server's, of
// the sandbox's task and of a branch). ttrpc carries no cancel: the shim
// started the process all the same and nobody owned it, and a start of
// the sandbox's task cut midway left its exec running (CI: a server
// stopped under an exec that was starting answered 499 and left it).
// The cancels fall from the call's start to 1.3 times a whole start.
func TestExecCanceledMidStart(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	cc, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	before := fifoDirs()
	const marker = "sleep 4323"
	args := []string{"sh", "-c", "exec " + marker}
	type process interface {
		Wait(context.Context) (client.ExitStatus, error)
		KillAll(context.Context, uint32) error
	}
	// end is what a caller does with what its exec gave: a process
	// started before the cancel is killed and waited for.
	end := func(p process, err error) bool {
		if err != nil {
			return false
		}
		_ = p.KillAll(ctx, uint32(unix.SIGKILL))
		if _, err := p.Wait(ctx); err != nil {
			t.Errorf("wait for an exec killed: %v", err)
		}
		return true
	}
	starts := map[string]func(context.Context) bool{
		"client, branch": func(ectx context.Context) bool {
			return end(sc.Exec(ectx, kid.ID, client.ExecOptions{Args: args}))
		},
		"ops, sandbox": func(ectx context.Context) bool {
			p, err := ops.Exec(ectx, cc, sc, "0", client.ExecOptions{Args: args})
			return end(p, err)
		},
		"ops, branch": func(ectx context.Context) bool {
			p, err := ops.Exec(ectx, cc, sc, kid.ID, client.ExecOptions{Args: args})
			return end(p, err)
		},
	}
	for name, start := range starts {
		t0 := time.Now()
		if !start(ctx) {
			t.Fatalf("%s: an exec not canceled failed", name)
		}
		whole := time.Since(t0)
		started := 0
		for i := range 40 {
			ectx, cancel := context.WithCancel(ctx)
			time.AfterFunc(whole*time.Duration(i)/30, cancel)
			if start(ectx) {
				started++
			}
			cancel()
			settled(t, ctx, sc)
		}
		t.Logf("%s: a start and wait in %v; %d of 40 started before their cancel", name, whole, started)
	}
	waitUntil(t, "no exec running after its caller left", 20*time.Second, func() bool {
		return hostProcsWith(env.Namespace, "sb", marker) == 0
	})
	waitUntil(t, "the execs' FIFOs released", 20*time.Second, func() bool {
		return slices.Equal(fifoDirs(), before)
	})
}

// TestExecDeadlineMidStart: an exec whose caller's deadline passes while
// it starts is killed in the shim (callerGone), and then forgotten there:
// its exec id was kept in its branch's table until the branch ended, so
// a caller trying again with the same id was refused "already used".
// Deadlines fall from the call's start to 1.5 times a whole start, 5 times
// and until the shim has killed one, on a branch whose init starts the
// process and on one the runtime starts it in (a sandbox allowed ptrace).
// A start through the init cut at the deadline left its process running,
// unknown to anyone (1 run in 3).
func TestExecDeadlineMidStart(t *testing.T) {
	for name, flags := range map[string][]string{"branch init": nil, "runtime": {"--seccomp", "--cap-add", "CAP_SYS_PTRACE"}} {
		t.Run(name, func(t *testing.T) { execDeadlineMidStart(t, flags) })
	}
}

func execDeadlineMidStart(t *testing.T, flags []string) {
	ctx, env, sc := sandboxCtxEnv(t, flags...)
	b := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0].ID
	// Each exec sleeps its own time, so that one left running is known.
	const marker = "sleep 432"
	args := func(n int) []string { return []string{"sh", "-c", fmt.Sprintf("exec sleep %d", 4320000+n)} }
	killed := regexp.MustCompile(`exec's caller left while it started: killed.* exec=(\S+)`)
	killedIDs := func() map[string]bool {
		ids := map[string]bool{}
		for _, m := range killed.FindAllStringSubmatch(env.Log("containerd"), -1) {
			ids[strings.Trim(m[1], `"`)] = true
		}
		return ids
	}
	end := func(p *client.Process) {
		_ = p.KillAll(ctx, uint32(unix.SIGKILL))
		if _, err := p.Wait(ctx); err != nil {
			t.Errorf("wait for an exec killed: %v", err)
		}
		p.Close()
	}
	t0 := time.Now()
	p, err := sc.Exec(ctx, b, client.ExecOptions{Args: args(9999)})
	if err != nil {
		t.Fatalf("branch %s: an exec with no deadline: %v", b, err)
	}
	whole := time.Since(t0)
	end(p)
	var gone []string
	for i := 0; i < 300 && (i < 150 || len(gone) == 0); i++ {
		id := fmt.Sprintf("dl-%s-%d", b, i)
		dctx, cancel := context.WithTimeout(ctx, whole*time.Duration(i%30)/20)
		p, err := sc.Exec(dctx, b, client.ExecOptions{ID: id, Args: args(i)})
		cancel()
		if err == nil {
			end(p)
			continue
		}
		// Whatever the shim did with it (nothing, killed it, or
		// started it for the client to kill), the id is free again.
		var again *client.Process
		waitUntil(t, "exec id "+id+" free again after its caller's deadline", 10*time.Second, func() bool {
			p, err := sc.Exec(ctx, b, client.ExecOptions{ID: id, Args: args(5000 + i)})
			if errors.Is(err, errdefs.ErrAlreadyExists) {
				return false
			}
			if err != nil {
				t.Fatalf("exec again with id %s: %v", id, err)
			}
			again = p
			return true
		})
		end(again)
		if killedIDs()[id] {
			gone = append(gone, id)
		}
	}
	if len(gone) == 0 {
		t.Fatalf("branch %s: no exec's deadline passed while it started, in 300 (a whole start: %v)", b, whole)
	}
	t.Logf("branch %s: a start in %v; %d execs killed in the shim", b, whole, len(gone))
	polls := 0
	waitUntil(t, "no exec running after its caller left", 20*time.Second, func() bool {
		if hostProcsWith(env.Namespace, "sb", marker) == 0 {
			return true
		}
		if polls++; polls == 100 {
			for _, p := range containerHostProcs(env.Namespace, "sb", 0) {
				if strings.Contains(p.cmd, marker) {
					t.Logf("left running: %+v", p)
				}
			}
		}
		return false
	})
}

// TestForkCanceledMidCall: a fork whose caller's context ends before the
// answer leaves no branch behind, through the Go client (and so the HTTP
// API's, whose request's context ends when its client leaves): the shim
// made the branches all the same, which nobody knew and which counted
// against the sandbox's live branches until it ended; they are now
// aborted once the shim answers, and the client's Close waits for that.
// The cancels fall from the call's start to 3 times a whole fork (the shim finishes a
// fork whose caller left before it takes the next).
func TestForkCanceledMidCall(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	// The forks go through a client of their own, closed at the end:
	// Close waits for what is undone.
	fc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "sb")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	b := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	whole := time.Since(t0)
	for _, br := range b {
		if _, err := sc.Abort(ctx, br.ID); err != nil {
			t.Fatal(err)
		}
	}
	forked := 0
	for i := range 40 {
		fctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(whole*time.Duration(i)/13, cancel)
		got, err := fc.Fork(fctx, client.ForkOptions{Count: 2})
		cancel()
		settled(t, ctx, fc)
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("fork %d: %v", i, err)
		}
		for _, br := range got {
			forked++
			if _, err := sc.Abort(ctx, br.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("a fork of 2 in %v; %d of 40 answered before their cancel", whole, forked/2)
	if err := fc.Close(); err != nil {
		t.Fatal(err)
	}
	noOrphans(t, ctx, sc)
}

// TestSelfCanceledMidCall: TestForkCanceledMidCall and
// TestExecCanceledMidStart through a sandbox's own branch socket
// (client.SelfClient, `branchctl self`), from a process in the sandbox
// (cancelHog): once its client is closed, none of its execs runs (it
// checks) and no branch of its forks is live; a checkpoint cut at its
// deadline is not kept (it checks).
func TestSelfCanceledMidCall(t *testing.T) {
	sockHog()
	ctx, env, _ := shimEnvWith(t, daemons.Config{})
	importInsockImage(t, ctx, env)
	runBoundedSandbox(t, ctx, env, "sb")
	sc := sandboxClient(t, ctx, env, "sb")
	stdin, stdout, hog := startSockHog(t, env, "sb", "TestSelfCanceledMidCall", "cancel:"+branchSocket(env, "sb")+":0:0")
	line, err := stdout.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "answered") {
		t.Fatalf("the cancelling process said %q (%v)", line, err)
	}
	t.Log(strings.TrimSpace(line))
	stdin.Close()
	if err := hog.Wait(); err != nil {
		t.Fatal(err)
	}
	noOrphans(t, ctx, sc)
}

// settled returns once what sc's cancelled calls left to undo is done (a
// call waits for that before it is sent): the next call of a sweep is
// then sent at once, its cancel falling where the sweep puts it.
func settled(t *testing.T, ctx context.Context, sc *client.SandboxClient) {
	t.Helper()
	if _, err := sc.Tree(ctx); err != nil {
		t.Fatal(err)
	}
}

// noOrphans fails t if a branch of sc other than the sandbox is live:
// the tests that call it aborted every branch they were told of.
func noOrphans(t *testing.T, ctx context.Context, sc *client.SandboxClient) {
	t.Helper()
	if live := liveBranchIDs(t, ctx, sc); len(live) > 0 {
		t.Errorf("branches %v live, made by forks whose callers left", live)
	}
}

const cancelHogMarker = "sleep 4324"

// cancelHog forks and execs through the branch socket at path with its
// cancels spread across the calls (as TestForkCanceledMidCall's), ends
// what was answered, checkpoints with deadlines spread across the calls
// (as TestDeadlineSweep's), closes its client and prints how many calls
// were answered or cut.
func cancelHog(path string) {
	ctx := context.Background()
	sc, err := client.DialSelf(ctx, path)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	fail := func(what string, err error) {
		fmt.Println(strings.ReplaceAll(fmt.Sprintf("%s: %v", what, err), "\n", " "))
		os.Exit(1)
	}
	spread := func(whole time.Duration, call func(context.Context) (bool, error)) int {
		answered := 0
		for i := range 30 {
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(whole*time.Duration(i)/10, cancel)
			ok, err := call(cctx)
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				fail("call", err)
			}
			// After what the cancelled call left to undo (as settled).
			if _, _, err := sc.Tree(ctx); err != nil {
				fail("tree", err)
			}
			if ok {
				answered++
			}
		}
		return answered
	}
	fork := func(ctx context.Context) (bool, error) {
		kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
		for _, k := range kids {
			if _, err := sc.Abort(context.Background(), k.ID); err != nil {
				fail("abort", err)
			}
		}
		return len(kids) > 0, err
	}
	// The execs run in a branch (the socket runs none in its own).
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
	if err != nil {
		fail("fork", err)
	}
	b := kids[0].ID
	exec := func(ctx context.Context) (bool, error) {
		id, err := sc.Exec(ctx, b, client.SelfExecOptions{Args: []string{"sh", "-c", "exec " + cancelHogMarker}})
		if err != nil {
			return false, err
		}
		if err := sc.KillAll(context.Background(), b, id, uint32(syscall.SIGKILL)); err != nil {
			fail("kill", err)
		}
		_, err = sc.Wait(context.Background(), b, id)
		return true, err
	}
	t0 := time.Now()
	if _, err := fork(ctx); err != nil {
		fail("fork", err)
	}
	forks := spread(time.Since(t0), fork)
	t0 = time.Now()
	if _, err := exec(ctx); err != nil {
		fail("exec", err)
	}
	execs := spread(time.Since(t0), exec)
	// A checkpoint whose deadline passes is not kept: listed exactly when
	// made, and a retry under its name made (TestDeadlineSweep's).
	t0 = time.Now()
	if _, err := sc.Checkpoint(ctx, "", "whole"); err != nil {
		fail("checkpoint", err)
	}
	whole := time.Since(t0)
	cut := 0
	for i := range 30 {
		name := fmt.Sprintf("cut-%d", i)
		dctx, cancel := context.WithTimeout(ctx, whole*time.Duration(i)/20)
		_, err := sc.Checkpoint(dctx, "", name)
		cancel()
		cks, lerr := sc.Checkpoints(ctx)
		if lerr != nil {
			fail("checkpoints", lerr)
		}
		listed := slices.ContainsFunc(cks, func(ck branch.Checkpoint) bool { return ck.Name == name })
		if listed != (err == nil) {
			fail("checkpoint "+name, fmt.Errorf("listed %v after %v", listed, err))
		}
		if err != nil {
			cut++
			if _, err := sc.Checkpoint(ctx, "", name); err != nil {
				fail("checkpoint "+name+" again", err)
			}
		}
		if err := sc.DeleteCheckpoint(ctx, name); err != nil {
			fail("delete checkpoint", err)
		}
	}
	// A Run past its deadline kills what it ran (TestRunKilledWithItsContext).
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = sc.Run(rctx, b, client.SelfExecOptions{Args: []string{"sh", "-c", "sleep 4327 & exec sleep 4327"}})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		fail("run past its deadline", err)
	}
	// Killed: gone once the kernel has ended them (the socket's Wait
	// answers at the exec's own exit, not its session's).
	if pid := markedFor("sleep 4327", 5*time.Second); pid != "" {
		fail("run past its deadline", fmt.Errorf("process %s runs", pid))
	}
	// Close waits for what the calls left to undo; the branch the execs
	// ran in goes after (its abort would kill what runs in it).
	if err := sc.Close(); err != nil {
		fail("close", err)
	}
	if pid := markedFor(cancelHogMarker, 5*time.Second); pid != "" {
		fail("after close", fmt.Errorf("exec %s runs", pid))
	}
	if sc, err = client.DialSelf(ctx, path); err != nil {
		fail("dial", err)
	}
	if _, err := sc.Abort(ctx, b); err != nil {
		fail("abort", err)
	}
	if err := sc.Close(); err != nil {
		fail("close", err)
	}
	fmt.Printf("answered %d of 30 forks and %d of 30 execs before their cancel; %d of 30 checkpoints cut at their deadline\n", forks, execs, cut)
	os.Exit(0)
}

// TestRunKilledWithItsContext: Run whose context ends while the command
// runs kills it and what it started, and releases its output, as
// exec.CommandContext does; it returned the context's error and left them
// running, with nobody holding a handle to them (and its FIFOs open).
func TestRunKilledWithItsContext(t *testing.T) {
	ctx, _, sc := sandboxCtxEnv(t)
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	before := fifoDirs()
	const marker = "sleep 4325"
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := sc.Run(rctx, kid.ID, client.ExecOptions{Args: []string{"sh", "-c", "sleep 4325 & exec " + marker}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run past its deadline: %v", err)
	}
	if pid := markedFor(marker, 5*time.Second); pid != "" {
		t.Errorf("process %s runs after its Run ended (%v): %s", pid, err, procSummary(pid))
	}
	if after := fifoDirs(); !slices.Equal(after, before) {
		t.Errorf("exec FIFOs before %v, after %v", before, after)
	}
}

// markedFor is withMarker once no process has marker, or after timeout:
// the pid of one that still has it then, or "".
func markedFor(marker string, timeout time.Duration) string {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if pid := withMarker(marker); pid == "" || time.Now().After(deadline) {
			return pid
		}
	}
}

// procSummary describes a process for a failure: its command line, stat
// and cgroup.
func procSummary(pid string) string {
	var parts []string
	for _, f := range []string{"cmdline", "stat", "cgroup"} {
		b, _ := os.ReadFile(filepath.Join("/proc", pid, f))
		parts = append(parts, f+": "+strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")))
	}
	return strings.Join(parts, "; ")
}
