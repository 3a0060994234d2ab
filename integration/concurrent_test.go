//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// expectedRace tells whether err is an answer a caller racing others on
// the same sandbox can get: its branch lost to a sibling's commit (stale),
// or ended meanwhile (not found), or is busy (failed precondition), or a
// bound was reached (resource exhausted).
func expectedRace(err error) bool {
	return errors.As(err, new(*branch.StaleError)) || errdefs.IsNotFound(err) ||
		errdefs.IsFailedPrecondition(err) || errdefs.IsResourceExhausted(err)
}

// TestConcurrentAgents: eight agents share one sandbox, as an
// orchestrator's workers do, each in a loop: fork a branch of the sandbox,
// run in it, now and then checkpoint it, fork below it and commit or abort
// that, roll it back, then commit or abort it; every commit invalidates the
// other agents' branches under them. Every call answers within its
// deadline, with success or an answer a race explains (stale, not found,
// failed precondition, resource exhausted); at the end no branch is left
// live, and what the session made (cgroups, mounts, runtime state) is
// gone. BRANCHBOX_AGENTS_SECONDS sets how long they run (default 5).
func TestConcurrentAgents(t *testing.T) {
	secs := 5
	if s, err := strconv.Atoi(os.Getenv("BRANCHBOX_AGENTS_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	ctx, env, _ := shimEnv(t)
	// The env's context ends after five minutes; a long run goes on.
	ctx = context.WithoutCancel(ctx)
	sc := runSandbox(t, ctx, env, "docker.io/branchbox/busybox:test", "sh", "-c", "exec sleep 100000")
	cgroupList := func() []string {
		var out []string
		for _, d := range containerCgroupDirs(env.Namespace, "sb") {
			_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					out = append(out, p)
				}
				return nil
			})
		}
		return out
	}
	// The env's mounts only: the other packages' tests run beside this
	// one (go test runs packages in parallel), and a snapshotter test
	// held a mount of its own under /tmp past this test's 20 s.
	mountList := func() []string { return mountsUnder(env.Dir) }
	cgBefore, mountsBefore := cgroupList(), mountList()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var (
		mu    sync.Mutex
		stats = map[string]int{}
		wg    sync.WaitGroup
		// dumpOnce: one goroutine dump of the shim per run.
		dumpOnce sync.Once
	)
	note := func(op string, err error) bool {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			stats[op+" ok"]++
			return true
		case expectedRace(err):
			stats[op+" raced"]++
			if stats[op+" raced"] == 1 {
				t.Logf("%s raced, for one: %v", op, err)
			}
		default:
			stats[op+" FAILED"]++
			t.Errorf("%s: %v", op, err)
		}
		return false
	}
	for a := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(a)))
			for time.Now().Before(end) {
				octx, cancel := context.WithTimeout(ctx, 60*time.Second)
				// A round slower than 20s has the shim's goroutines logged
				// while it is still held up (once).
				slow := time.AfterFunc(20*time.Second, func() { dumpOnce.Do(func() { hung(t, env) }) })
				agentRound(octx, sc, rng, a, note)
				slow.Stop()
				if errors.Is(octx.Err(), context.DeadlineExceeded) {
					t.Errorf("agent %d: a round hung for a minute", a)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	t.Logf("%v", stats)
	// What is left: abort every live branch; then nothing of theirs stays.
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID != branch.RootID && n.Parent == branch.RootID && n.State == branch.Live {
			if _, err := sc.Abort(ctx, n.ID); err != nil && !expectedRace(err) {
				t.Errorf("abort %s at the end: %v", n.ID, err)
			}
		}
	}
	// What the sandbox keeps of its own once it had branches, until its
	// end: the freezer key (cgroup.HoldFreezerKey) and, on cgroup v2, the
	// leaf its own processes moved into (cgroup.OwnLeaf).
	sandboxOwn := map[string]bool{}
	for _, d := range containerCgroupDirs(env.Namespace, "sb") {
		sandboxOwn[filepath.Join(d, ".freezer-key")] = true
		sandboxOwn[filepath.Join(d, ".leaf")] = true
	}
	var cgLeft, mountsLeft []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		cgLeft, mountsLeft = nil, added(mountsBefore, mountList())
		for _, d := range added(cgBefore, cgroupList()) {
			// The init pool names its waiting inits' cgroups after the
			// ids the next forks of the sandbox likely get.
			if !onlyPoolInits(d) && !sandboxOwn[d] {
				cgLeft = append(cgLeft, d)
			}
		}
		if len(cgLeft)+len(mountsLeft) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, d := range cgLeft {
				procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				frozen, _ := os.ReadFile(filepath.Join(d, "freezer.state"))
				t.Logf("%s: procs %q %s", d, procs, frozen)
				for _, p := range strings.Fields(string(procs)) {
					cmd, _ := os.ReadFile("/proc/" + p + "/cmdline")
					st, _ := os.ReadFile("/proc/" + p + "/stat")
					t.Logf("  pid %s: %q %s", p, cmd, st)
				}
			}
			if nodes, err := sc.Tree(ctx); err == nil {
				for _, n := range nodes {
					t.Logf("tree: %s parent %s state %s status %s pids %v", n.ID, n.Parent, n.State, n.Status, n.Pids)
				}
			}
			t.Fatalf("left after 20s: cgroups %q, mounts %q", cgLeft, mountsLeft)
		}
	}
	nodes, err = sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID != branch.RootID && n.State == branch.Live {
			t.Errorf("branch %s left live: %+v", n.ID, n.Node)
		}
	}
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "ls /agent-* | wc -l"); err != nil || strings.TrimSpace(out) == "0" {
		t.Errorf("no agent's commit reached the sandbox: %q %v", out, err)
	}
}

// agentRound is one agent's try: a branch of the sandbox, worked in, then
// committed or aborted.
func agentRound(ctx context.Context, sc *client.SandboxClient, rng *rand.Rand, a int, note func(string, error) bool) {
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
	if !note("fork", err) {
		return
	}
	b := kids[0].ID
	out, st, err := runErr(ctx, sc, b, "sh", "-c", fmt.Sprintf("echo %d > /agent-%d", a, a))
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("exit %d: %s", st.Code, out)
		// A process of a branch killed while it runs is killed (137),
		// its status saying why, and may first see its layer go (its
		// writes failing): the branch's end is the answer
		// (docs/lifecycle.md).
		switch {
		case st.Code == 137 && st.BranchEnded != "":
			note("exec killed with its branch", nil)
			return
		case ended(ctx, sc, b):
			if st.Code != 137 {
				note("exec in a branch that ended", nil)
				return
			}
			err = fmt.Errorf("killed (137) as its branch ended, and its status does not say so: %s", out)
		}
	}
	if !note("exec", err) {
		return
	}
	if rng.Intn(3) == 0 {
		// Checkpoint names are the sandbox's: one per branch.
		_, err := sc.Checkpoint(ctx, b, "ck-"+b)
		if note("checkpoint", err) && rng.Intn(2) == 0 {
			note("rollback", sc.Rollback(ctx, b, "ck-"+b))
		}
	}
	if rng.Intn(3) == 0 {
		sub, err := sc.Fork(ctx, client.ForkOptions{Parent: b, Count: 2})
		if note("nested fork", err) {
			if rng.Intn(2) == 0 {
				_, err = sc.Commit(ctx, sub[0].ID)
				note("nested commit", err)
			} else {
				_, err = sc.Abort(ctx, sub[0].ID)
				note("nested abort", err)
			}
		}
	}
	if rng.Intn(3) == 0 {
		_, err = sc.Commit(ctx, b)
		note("commit", err)
		return
	}
	_, err = sc.Abort(ctx, b)
	note("abort", err)
}

// hung has the env's shims log their goroutines (containerd's shim does on
// SIGUSR1), and logs that part of containerd's log, where a shim's
// output goes; BRANCHBOX_HANG_LOG names a file for the whole log.
func hung(t *testing.T, env *daemons.Env) {
	for _, p := range env.ShimPids() {
		_ = syscall.Kill(p, syscall.SIGUSR1)
	}
	time.Sleep(2 * time.Second)
	log := env.Log("containerd")
	if f := os.Getenv("BRANCHBOX_HANG_LOG"); f != "" {
		_ = os.WriteFile(f, []byte(log), 0o644)
	}
	i := strings.LastIndex(log, "BEGIN goroutine stack dump")
	if i < 0 {
		return
	}
	dump, _, _ := strings.Cut(log[i:], "END goroutine stack dump")
	dump = strings.NewReplacer(`\n`, "\n", `\t`, "\t").Replace(dump)
	// The goroutines in the project's code: what waits for what.
	for _, g := range strings.Split(dump, "\n\n") {
		if strings.Contains(g, "branchbox/branchbox/shim") {
			t.Logf("shim goroutine:\n%s", g)
		}
	}
	hungClients(t)
}

// hungClients logs this process's goroutines that are in a call or its
// stdio (an exec's FIFOs, which the shim waits to open), and which
// processes hold each exec FIFO open.
func hungClients(t *testing.T) {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "containerd/fifo") || strings.Contains(g, "agentRound") {
			t.Logf("test goroutine:\n%s", g)
		}
	}
	holders := map[string][]string{}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && strings.Contains(l, "-std") {
			holders[l] = append(holders[l], fd)
		}
	}
	// The client's FIFOs are where containerd's clients make theirs.
	_ = filepath.WalkDir("/run/containerd/fifo", func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type()&fs.ModeNamedPipe != 0 {
			t.Logf("FIFO %s held by %v", p, holders[p])
		}
		return nil
	})
}

// ended tells whether branch id is no longer live.
func ended(ctx context.Context, sc *client.SandboxClient, id string) bool {
	nodes, err := sc.Tree(ctx)
	if err != nil {
		return false
	}
	for _, n := range nodes {
		if n.ID == id {
			return n.State != branch.Live
		}
	}
	return true
}

// onlyPoolInits tells whether the cgroup dir holds processes and all are
// branch inits waiting in the sandbox's pool (initdriver.Pool).
func onlyPoolInits(dir string) bool {
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil || len(strings.Fields(string(procs))) == 0 {
		return false
	}
	for _, p := range strings.Fields(string(procs)) {
		comm, _ := os.ReadFile("/proc/" + p + "/comm")
		if strings.TrimSpace(string(comm)) != "brinit-wait" {
			return false
		}
	}
	return true
}

// added is what now has that before had not.
func added(before, now []string) []string {
	had := map[string]bool{}
	for _, b := range before {
		had[b] = true
	}
	var out []string
	for _, n := range now {
		if !had[n] {
			out = append(out, n)
		}
	}
	return out
}
