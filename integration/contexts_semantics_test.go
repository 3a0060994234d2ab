//go:build linux

package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// sandboxInitPid is the host pid of the sandbox's init.
func sandboxInitPid(t *testing.T, ctx context.Context, sc *client.SandboxClient) int {
	t.Helper()
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == branch.RootID && n.InitPid > 0 {
			return n.InitPid
		}
	}
	t.Fatal("tree reports no sandbox init pid")
	return 0
}

// startAdversarialIn runs the adversarial workload of the shim's kill
// suite in a branch and waits until, seen from the host, its fork bomb has
// filled the branch's pids limit and its nested PID namespace exists.
func startAdversarialIn(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, k client.BranchInfo) []hostProc {
	t.Helper()
	p, err := sc.Exec(ctx, k.ID, client.ExecOptions{Args: []string{"sh", "-c", adversarial}})
	if err != nil {
		t.Fatal(err)
	}
	// Killed with its branch, never waited for: release its stdio.
	t.Cleanup(p.Close)
	var procs []hostProc
	initNS, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", k.InitPid))
	defer func() {
		if t.Failed() {
			for _, p := range procs {
				t.Logf("branch %s process %d: %s", k.ID, p.pid, p.cmd)
			}
		}
	}()
	waitUntil(t, "the fork bomb in branch "+k.ID+" to fill its pids limit", 30*time.Second, func() bool {
		procs = branchProcs(env, k)
		nested := false
		for _, p := range procs {
			if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.pid)); ns != "" && ns != initNS {
				nested = true
			}
		}
		// The limit counts threads too, and the waiting init has several:
		// the bomb is at the limit when the cgroup's count is.
		cur, _ := os.ReadFile(cgroupFile("pids", k.Cgroup, "pids.current"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(cur)))
		return nested && n >= adversarialPidsLimit-1
	})
	return procs
}

// hostProcIn starts a process on the host, outside any branch's PID
// namespace, and puts it into the cgroup cg: the kill of the branch must
// find it there.
func hostProcIn(t *testing.T, cg string) hostProc {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // reaped as it dies
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	moveIntoCgroup(t, cmd.Process.Pid, cg)
	start, _ := procStart(cmd.Process.Pid)
	return hostProc{pid: cmd.Process.Pid, start: start, cmd: "sleep 1000 (from the host)"}
}

// TestContextsKillSuite runs the shim's adversarial kill suite inside
// branches (ignored signals, a setsid double-forked daemon, a nested PID
// namespace, a fork bomb held by the pids limit, and a process put into
// its cgroup from the host) and checks from the host
// that nothing survives an abort, nor the losing side of a commit race, nor
// the winner of it.
func TestContextsKillSuite(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t, "--cap-add", "CAP_SYS_ADMIN")
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 3, Pids: adversarialPidsLimit})
	procs := make([][]hostProc, len(kids))
	for i, k := range kids {
		procs[i] = append(startAdversarialIn(t, ctx, env, sc, k), hostProcIn(t, k.Cgroup))
	}
	if _, err := sc.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, kids[0], procs[0])
	// The other two race to commit; exactly one wins.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := 1; i <= 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i-1] = sc.Commit(ctx, kids[i].ID) }()
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("commit race: %v / %v; want exactly one winner", errs[0], errs[1])
	}
	assertBranchGone(t, env, kids[1], procs[1])
	assertBranchGone(t, env, kids[2], procs[2])
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "before\n" {
		t.Fatalf("sandbox after the race: %q %v", out, err)
	}
}

// TestContextsSiblingIsolation: a branch sees only its own processes,
// cannot signal its sibling's (or the sandbox's), and shares the sandbox's
// network namespace unless isolated, in which it has only loopback.
func TestContextsSiblingIsolation(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	a, b := kids[0], kids[1]
	victim, err := sc.Exec(ctx, a.ID, client.ExecOptions{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.Close)
	victimStart, _ := procStart(victim.Pid)
	// b sees its init and itself only (sh, ls, wc).
	out := mustRun(t, ctx, sc, b.ID, "sh", "-c", "ls -d /proc/[0-9]* | wc -l")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n > 4 {
		t.Fatalf("branch b sees %d processes; want only its own", n)
	}
	// b kills everything it can; a's process and the sandbox live on.
	run(t, ctx, sc, b.ID, "sh", "-c", "kill -9 -1; for p in $(seq 1 200); do kill -9 $p; done 2>/dev/null; true")
	time.Sleep(100 * time.Millisecond)
	if start, ok := procStart(victim.Pid); !ok || start != victimStart {
		t.Fatal("a process of branch a died when branch b killed everything it could")
	}
	if _, err := execIn(ctx, env, "sb", "true"); err != nil {
		t.Fatalf("sandbox after branch b killed everything: %v", err)
	}
	// Neither can ptrace what it cannot see.
	if out, code := run(t, ctx, sc, b.ID, "sh", "-c", fmt.Sprintf("cat /proc/%d/cmdline", victim.Pid)); code == 0 && strings.Contains(out, "sleep") {
		t.Fatalf("branch b reads branch a's process: %q", out)
	}
	sbNet, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", sandboxInitPid(t, ctx, sc)))
	aNet, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", a.InitPid))
	if sbNet == "" || aNet != sbNet {
		t.Fatalf("branch net namespace %q, sandbox's %q; want shared", aNet, sbNet)
	}
	// An isolated branch of a branch: its own namespace, loopback only.
	iso := fork(t, ctx, sc, client.ForkOptions{Parent: a.ID, Count: 1, Net: "isolated"})[0]
	isoNet, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", iso.InitPid))
	if isoNet == "" || isoNet == sbNet {
		t.Fatalf("isolated branch net namespace %q; want a new one", isoNet)
	}
	out = mustRun(t, ctx, sc, iso.ID, "sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
	if strings.TrimSpace(out) != "lo" {
		t.Fatalf("isolated branch interfaces: %q; want only lo", out)
	}
	if out := mustRun(t, ctx, sc, iso.ID, "cat", "/sys/class/net/lo/operstate"); strings.TrimSpace(out) == "down" {
		t.Fatalf("isolated branch's loopback is down")
	}
}

// TestContextsNesting forks a branch, commits a grandchild into it (the
// branch's running process sees the change, the grandchild's sibling is
// invalidated), then commits the branch into the sandbox.
func TestContextsNesting(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	b := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	mustRun(t, ctx, sc, b.ID, "sh", "-c", "echo level1 > /level")
	gs := fork(t, ctx, sc, client.ForkOptions{Parent: b.ID, Count: 2})
	// The branch is sealed now; its processes run on.
	if out, code := run(t, ctx, sc, b.ID, "sh", "-c", "echo x > /level"); code == 0 || !strings.Contains(out, "Read-only") {
		t.Fatalf("write in a sealed branch: %d %q; want EROFS", code, out)
	}
	watcher, err := sc.Exec(ctx, b.ID, client.ExecOptions{Args: []string{"sh", "-c", "while [ ! -e /grandchild ]; do sleep 0.02; done"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watcher.Close)
	if got := mustRun(t, ctx, sc, gs[0].ID, "cat", "/level"); got != "level1\n" {
		t.Fatalf("grandchild sees %q", got)
	}
	mustRun(t, ctx, sc, gs[0].ID, "sh", "-c", "echo level2 > /level && touch /grandchild")
	res, err := sc.Commit(ctx, gs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Parent.ID != b.ID || len(res.Invalidated) != 1 || res.Invalidated[0] != gs[1].ID {
		t.Fatalf("commit of the grandchild: %+v", res)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if st, err := watcher.Wait(wctx); err != nil || st.Code != 0 {
		t.Fatalf("the branch's running process did not see the grandchild's commit: %+v %v", st, err)
	}
	assertBranchGone(t, env, gs[1], nil)
	mustRun(t, ctx, sc, b.ID, "sh", "-c", "echo level1-again >> /level")
	if _, err := sc.Commit(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/level", "/grandchild"); err != nil || out != "level2\nlevel1-again\n" {
		t.Fatalf("sandbox after committing the chain: %q %v", out, err)
	}
}

// TestContextsLimitsAndOOM: fork takes per-branch limits (by default the
// sandbox's own); a branch that runs out of memory has its process killed
// and reported as OOM-killed while its sibling goes on.
func TestContextsLimitsAndOOM(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t, "--memory-limit", strconv.Itoa(512<<20))
	def := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	if def.Memory != 512<<20 {
		t.Fatalf("default branch memory limit %d; want the sandbox's %d", def.Memory, 512<<20)
	}
	if _, err := sc.Abort(ctx, def.ID); err != nil {
		t.Fatal(err)
	}
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2, Memory: 32 << 20, CPUs: 0.5, Pids: 20})
	a, b := kids[0], kids[1]
	limits := map[string]string{
		cgroupFile("memory", a.Cgroup, "memory.limit_in_bytes"): strconv.Itoa(32 << 20),
		cgroupFile("cpu", a.Cgroup, "cpu.cfs_quota_us"):         "50000",
		cgroupFile("pids", a.Cgroup, "pids.max"):                "20",
	}
	if cgroupV2() {
		limits = map[string]string{
			cgroupFile("memory", a.Cgroup, "memory.max"): strconv.Itoa(32 << 20),
			cgroupFile("cpu", a.Cgroup, "cpu.max"):       "50000 100000",
			cgroupFile("pids", a.Cgroup, "pids.max"):     "20",
			// A domain cgroup, with the memory and io controllers; a
			// threaded one has neither.
			cgroupFile("", a.Cgroup, "cgroup.type"): "domain",
		}
	}
	for file, want := range limits {
		got, err := os.ReadFile(file)
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("%s = %q (%v); want %s", file, got, err, want)
		}
	}
	_, st, err := runErr(ctx, sc, a.ID, "sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived")
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 137 || !st.OOMKilled {
		t.Fatalf("memory hog in a 32 MiB branch: %+v; want killed by the OOM killer", st)
	}
	if got := mustRun(t, ctx, sc, b.ID, "echo", "alive"); got != "alive\n" {
		t.Fatalf("sibling after the OOM: %q", got)
	}
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == a.ID && !n.OOMKilled {
			t.Errorf("tree does not report branch %s as OOM-killed", a.ID)
		}
		if n.ID == b.ID && n.OOMKilled {
			t.Errorf("tree reports the sibling as OOM-killed")
		}
		if n.ID == branch.RootID && n.OOMKilled {
			t.Errorf("tree reports the sandbox as OOM-killed for its branch's OOM")
		}
	}
	if _, err := execIn(ctx, env, "sb", "true"); err != nil {
		t.Fatalf("sandbox after a branch's OOM: %v", err)
	}
}

// freezerState is the freezer cgroup of process pid and its state: on v1
// the freezer hierarchy's and FROZEN or THAWED; on v2 the unified one's and
// frozen 1 or 0 as its cgroup.events says.
func freezerState(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		switch {
		case len(parts) == 3 && parts[1] == "freezer":
			s, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", parts[2], "freezer.state"))
			return parts[2] + " " + strings.TrimSpace(string(s))
		case len(parts) == 3 && parts[0] == "0" && cgroupV2():
			s, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", parts[2], "cgroup.events"))
			for _, e := range strings.Split(string(s), "\n") {
				if strings.HasPrefix(e, "frozen ") {
					return parts[2] + " " + e
				}
			}
			return parts[2]
		}
	}
	return ""
}

// TestContextsSealFreeze: with --seal freeze the sandbox's processes are
// frozen (not only its rootfs read-only) while it has branches, and thawed
// when the last one ends; new execs into the sandbox still run.
func TestContextsSealFreeze(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	pid := sandboxInitPid(t, ctx, sc)
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2, Seal: "freeze"})
	// The init's freezer cgroup and its state: on v1 the freezer
	// hierarchy's, FROZEN or THAWED; on v2 the unified one's, frozen or
	// not as its cgroup.events says. Frozen, it is the branch's seal leaf.
	leaf, frozen, thawed := "/.sealed", " FROZEN", " THAWED"
	if cgroupV2() {
		frozen, thawed = " frozen 1", " frozen 0"
	}
	state := func() string { return freezerState(pid) }
	if got := state(); !strings.HasSuffix(got, leaf+frozen) {
		t.Fatalf("sandbox init's freezer cgroup while forked with --seal freeze: %q", got)
	}
	// Branches run; the sandbox's exec path still works.
	mustRun(t, ctx, sc, kids[0].ID, "true")
	out, err := execIn(ctx, env, "sb", "cat", "/proc/self/cgroup")
	if err != nil {
		t.Fatalf("ctr t exec into a frozen-sealed sandbox: %v", err)
	}
	// It runs outside the frozen leaf: on v1 in the sandbox's own cgroup,
	// on v2 in the leaf its processes live in beside its branches (the
	// sandbox's own cgroup cannot hold a process there).
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasSuffix(l, "/.sealed") || (cgroupV2() && !strings.HasSuffix(l, "/.leaf")) {
			t.Errorf("exec into a frozen-sealed sandbox runs in cgroup %q", l)
		}
	}
	if _, err := sc.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := state(); !strings.HasSuffix(got, leaf+frozen) {
		t.Fatalf("sandbox thawed while a branch lives: %q", got)
	}
	if _, err := sc.Abort(ctx, kids[1].ID); err != nil {
		t.Fatal(err)
	}
	if got := state(); strings.Contains(got, ".sealed") || !strings.HasSuffix(got, thawed) {
		t.Fatalf("sandbox after the last branch ended: %q; want thawed in its own cgroup", got)
	}
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "echo writable > /state"); err != nil {
		t.Fatalf("sandbox not writable after unseal: %v", err)
	}
}

// TestContextsForkCommand: a branch can run a command as its init instead
// of the waiting init; its output is kept, and exec into it works while it
// runs.
func TestContextsForkCommand(t *testing.T) {
	ctx, _, sc := sandboxCtxEnv(t)
	k := fork(t, ctx, sc, client.ForkOptions{Count: 1, Args: []string{"sh", "-c", "echo started > /started; exec sleep 1000"}})[0]
	if k.Status != "running" {
		t.Fatalf("status %q; want running", k.Status)
	}
	waitUntil(t, "the branch command to write /started", 10*time.Second, func() bool {
		out, code := run(t, ctx, sc, k.ID, "cat", "/started")
		return code == 0 && out == "started\n"
	})
}

// TestContextsForkCostFlat: forking does not copy the rootfs, so its cost
// cannot grow with it: a child of a sandbox holding 10,000 more files and
// 64 MiB starts with an empty upper layer and still sees all of it. (How
// long a fork takes is for the benchmarks, BenchmarkContextFork and the
// snapshotter's BenchmarkFork by base size, not for a test.)
func TestContextsForkCostFlat(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	if _, err := execIn(ctx, env, "sb", "sh", "-c", "mkdir /big && cd /big && seq 1 10000 | xargs touch && dd if=/dev/zero of=/big/blob bs=1M count=64 2>/dev/null"); err != nil {
		t.Fatal(err)
	}
	k := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, n := range nodes {
		if n.ID != k.ID {
			continue
		}
		found = true
		// An empty upper: its root directory, and the overlay's work
		// directories at most.
		if n.UpperSize > 64<<10 || n.UpperInodes > 8 {
			t.Fatalf("a fresh branch's upper holds %d bytes in %d inodes: the fork copied", n.UpperSize, n.UpperInodes)
		}
	}
	if !found {
		t.Fatalf("branch %s not in the tree", k.ID)
	}
	if out, code := run(t, ctx, sc, k.ID, "sh", "-c", "ls /big | wc -l; wc -c < /big/blob"); code != 0 || out != "10001\n67108864\n" {
		t.Fatalf("the branch sees %q (exit %d), want 10,001 entries and the 64 MiB blob", out, code)
	}
}

// TestContextsEvents: fork, commit, abort and invalidation reach
// containerd's event service, as `ctr events` shows.
func TestContextsEvents(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ectx, filepath.Join(env.BinDir, "ctr"), "--address", env.Address, "events")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	time.Sleep(200 * time.Millisecond) // ctr subscribes
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 3})
	if _, err := sc.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Commit(ctx, kids[1].ID); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/branch/fork":       `"branchbox.branches":"` + kids[0].ID + "," + kids[1].ID + "," + kids[2].ID + `"`,
		"/branch/abort":      `"branchbox.branches":"` + kids[0].ID + `"`,
		"/branch/commit":     `"branchbox.winner":"` + kids[1].ID + `"`,
		"/branch/invalidate": `"branchbox.branches":"` + kids[2].ID + `"`,
	}
	var seen []string
	timeout := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("ctr events ended; saw %v, missing %v", seen, want)
			}
			seen = append(seen, l)
			for topic, body := range want {
				if strings.Contains(l, " "+topic+" ") && strings.Contains(l, body) && strings.Contains(l, env.Namespace) {
					delete(want, topic)
				}
			}
		case <-timeout:
			t.Fatalf("events missing %v; saw:\n%s", want, strings.Join(seen, "\n"))
		}
	}
}
