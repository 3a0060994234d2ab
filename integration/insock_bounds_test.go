//go:build linux

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
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

// shimRSSBound is what a shim may hold resident (it starts at about 25
// MB) whatever a sandbox does through its branch socket: 1,000 forks, a
// recursive self-fork, 64 processes writing 6 MB each never waited for.
// Without the bounds the flood alone took the shim to 377 MB; with them
// it peaks near 45 MB.
const shimRSSBound = 100 << 20

// runBoundedSandbox runs a sandbox of the insock image with the branch
// socket and the given annotations, and waits until it wrote /state.
func runBoundedSandbox(t *testing.T, ctx context.Context, env *daemons.Env, id string, annotations ...string) {
	t.Helper()
	args := []string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "--annotation", "io.branchbox.socket=true"}
	for _, a := range annotations {
		args = append(args, "--annotation", a)
	}
	args = append(args, insockImage, id, "sh", "-c", "echo x > /state; exec sleep 100000")
	if _, err := env.Ctr(ctx, args...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, id) })
	waitFor(t, func() bool { _, err := execIn(ctx, env, id, "test", "-e", "/state"); return err == nil })
}

// vmRSS is a process's resident memory in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS of %d: %q", pid, v)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}

// watchRSS samples a process's resident memory until stop, which returns
// the most it saw.
func watchRSS(t *testing.T, pid int) (stop func() int64) {
	t.Helper()
	peak := vmRSS(t, pid)
	done, finished := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				continue
			}
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
					kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
					mu.Lock()
					peak = max(peak, kb<<10)
					mu.Unlock()
				}
			}
		}
	}()
	return func() int64 {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return max(peak, vmRSS(t, pid))
	}
}

// liveBranches counts the live branches in a sandbox's own tree.
func liveBranches(t *testing.T, ctx context.Context, env *daemons.Env, id string) int {
	t.Helper()
	out, err := execIn(ctx, env, id, "branchctl", "self", "tree", "--json")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range parseSelfTree(t, out).Branches {
		if c.ID != "0" && c.State == branch.Live {
			n++
		}
	}
	return n
}

// boundsEnv is an env whose shims have a node default of 16 live
// branches and depth 4 (the shim's environment), with the insock image.
func boundsEnv(t *testing.T) (context.Context, *daemons.Env) {
	ctx, env, _ := shimEnvWith(t, daemons.Config{ContainerdEnv: []string{"BRANCHBOX_MAX_BRANCHES=16", "BRANCHBOX_MAX_DEPTH=4"}})
	importInsockImage(t, ctx, env)
	return ctx, env
}

// TestInsockBounds: the bounds of the branch socket, end to end, with the
// node's defaults of boundsEnv: (a) a sandbox's annotation sets its own
// maximum over the node's, forks up to it succeed and the next is refused
// with resource exhausted, naming the bound, with nothing changed; a bad
// annotation fails the create; a fork over the fork rate is refused; (c)
// a branch that forks itself recursively is stopped by the bounds, and
// aborting it leaves nothing; (d) 64 processes writing 6 MB each, never
// waited for, leave the shim's memory bounded, and their output is there
// for Wait. (b) is TestInsockBoundsChurn.
func TestInsockBounds(t *testing.T) {
	ctx, env := boundsEnv(t)
	in := func(id string, args ...string) (string, error) { return execIn(ctx, env, id, args...) }
	must := func(id string, args ...string) string {
		t.Helper()
		out, err := in(id, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	phase := time.Now()
	lap := func(what string) {
		t.Logf("%s: %v", what, time.Since(phase).Round(time.Millisecond))
		phase = time.Now()
	}
	// A bad annotation fails the create, naming it.
	args := []string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "--annotation", "io.branchbox.max-branches=0", insockImage, "bad", "true"}
	if _, err := env.Ctr(ctx, args...); err == nil || !strings.Contains(err.Error(), "io.branchbox.max-branches") || !strings.Contains(err.Error(), "invalid argument") {
		t.Fatalf("create with max-branches=0: %v", err)
	}
	removeContainer(t, env, "bad")

	// (a) The annotation's maximum (8) over the node's (16).
	runBoundedSandbox(t, ctx, env, "capped", "io.branchbox.max-branches=8")
	var kids []client.BranchInfo
	if err := json.Unmarshal([]byte(must("capped", "branchctl", "self", "fork", "-n", "8", "--json")), &kids); err != nil || len(kids) != 8 {
		t.Fatalf("fork of 8: %v %+v", err, kids)
	}
	out, err := in("capped", "branchctl", "self", "fork", "-n", "1")
	if want := "sandbox capped has 8 live branches, its maximum (annotation io.branchbox.max-branches): abort some first: resource exhausted"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("fork past the maximum: %q %v; want %q", out, err, want)
	}
	if out, err := in("capped", "branchctl", "self", "fork", "-n", "9"); err == nil || !strings.Contains(err.Error(), "invalid argument") {
		t.Fatalf("fork of 9 with a maximum of 8: %q %v", out, err)
	}
	if n, l := liveBranches(t, ctx, env, "capped"), selfListeners(t, shimOf(t, env, "capped")); n != 8 || l != 9 {
		t.Fatalf("%d live branches and %d sockets after the refused forks, want 8 and 9", n, l)
	}
	must("capped", "branchctl", "self", "abort", kids[0].ID)
	must("capped", "branchctl", "self", "fork", "-n", "1")

	// The node's maximum (16) and depth (4), named as such.
	runBoundedSandbox(t, ctx, env, "node")
	must("node", "branchctl", "self", "fork", "-n", "16")
	if out, err := in("node", "branchctl", "self", "fork", "-n", "1"); err == nil || !strings.Contains(err.Error(), "has 16 live branches, its maximum (set for the node by BRANCHBOX_MAX_BRANCHES") {
		t.Fatalf("fork past the node's maximum: %q %v", out, err)
	}

	// The fork rate: a burst of max-branches, then one every 10 seconds; a
	// fork that would wait more than a second is refused at once.
	runBoundedSandbox(t, ctx, env, "slow", "io.branchbox.fork-rate=0.1", "io.branchbox.max-branches=4")
	for _, id := range strings.Fields(must("slow", "branchctl", "self", "fork", "-n", "4")) {
		must("slow", "branchctl", "self", "abort", id)
	}
	if out, err := in("slow", "branchctl", "self", "fork", "-n", "4"); err == nil || !strings.Contains(err.Error(), "forks from inside at most 0.1 branches a second (annotation io.branchbox.fork-rate)") || !strings.Contains(err.Error(), "resource exhausted") {
		t.Fatalf("fork over the rate: %q %v", out, err)
	}
	if n := liveBranches(t, ctx, env, "slow"); n != 0 {
		t.Fatalf("%d live branches after a fork over the rate", n)
	}

	lap("(a) caps and rate")
	// (c) A branch forks itself, 2 at a time, recursively: stopped by the
	// bounds (16 live, depth 4), each refusal in its init's log.
	runBoundedSandbox(t, ctx, env, "rec")
	must("rec", "sh", "-c", `printf 'branchctl self fork -n 2 -- sh /rec.sh\nexec sleep 100000\n' > /rec.sh`)
	must("rec", "branchctl", "self", "fork", "-n", "1", "--", "sh", "/rec.sh")
	bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "rec")
	refusals := func() (count, depth int) {
		logs, _ := filepath.Glob(filepath.Join(bundle, "branches", "*", "init.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			switch s := string(b); {
			case strings.Contains(s, "over its maximum of 16 (set for the node by BRANCHBOX_MAX_BRANCHES") && strings.Contains(s, "resource exhausted"):
				count++
			case strings.Contains(s, "deeper than the maximum of 4") && strings.Contains(s, "resource exhausted"):
				depth++
			}
		}
		return
	}
	// 1 + 2 + 4 + 8 = 15 live; a fork of 2 more would make 17, so each of
	// the 8 branches at depth 4 is refused (by the count, checked first;
	// the depth bound is checked below on its own).
	waitFor(t, func() bool { c, d := refusals(); return c+d == 8 })
	if n := liveBranches(t, ctx, env, "rec"); n != 15 {
		t.Fatalf("recursive self-fork: %d live branches, want 15", n)
	}
	recShim := shimOf(t, env, "rec")
	if peak := vmRSS(t, recShim); peak > shimRSSBound {
		t.Fatalf("shim RSS %d MB after the recursive fork", peak>>20)
	}
	top := ""
	for _, c := range parseSelfTree(t, must("rec", "branchctl", "self", "tree", "--json")).Branches {
		if c.Parent == "0" && c.State == branch.Live {
			top = c.ID
		}
	}
	must("rec", "branchctl", "self", "abort", top)
	if n := liveBranches(t, ctx, env, "rec"); n != 0 || selfListeners(t, recShim) != 1 || len(socketDirs(env, "rec")) != 1 {
		t.Fatalf("after aborting the recursion: %d live branches, %d listeners, socket dirs %v", n, selfListeners(t, recShim), socketDirs(env, "rec"))
	}
	waitFor(t, func() bool { d, _ := os.ReadDir(filepath.Join(bundle, "branches")); return len(d) == 0 })
	// The depth bound on its own: a chain of 4 forks, each of the last
	// branch; the fifth is refused.
	parent := ""
	for i := 0; i < 4; i++ {
		a := []string{"branchctl", "self", "fork", "-n", "1"}
		if parent != "" {
			a = append(a, "--parent", parent)
		}
		parent = strings.TrimSpace(must("rec", a...))
	}
	if out, err := in("rec", "branchctl", "self", "fork", "-n", "1", "--parent", parent); err == nil || !strings.Contains(err.Error(), "is 4 levels deep, and its branches would be deeper than the maximum of 4 (set for the node by BRANCHBOX_MAX_DEPTH") {
		t.Fatalf("fork at depth 5: %q %v", out, err)
	}

	lap("(c) recursion and depth")
	// (d) 64 processes in a branch, each writing 3 MB to stdout and 3 MB
	// to stderr, never waited for.
	runBoundedSandbox(t, ctx, env, "flood")
	fshim := shimOf(t, env, "flood")
	before := vmRSS(t, fshim)
	b := strings.TrimSpace(must("flood", "branchctl", "self", "fork", "-n", "1"))
	stop := watchRSS(t, fshim)
	ids := strings.Fields(must("flood", "sh", "-c", fmt.Sprintf(`i=0
while [ $i -lt 64 ]; do
	branchctl self exec -d %s -- sh -c "head -c 3000000 /dev/zero; head -c 3000000 /dev/zero >&2; touch /done.$i" || exit 1
	i=$((i+1))
done`, b)))
	if len(ids) != 64 {
		t.Fatalf("started %d processes, want 64: %v", len(ids), ids)
	}
	waitFor(t, func() bool {
		out, _ := in("flood", "branchctl", "self", "exec", b, "--", "sh", "-c", "ls / | grep -c '^done'")
		return strings.TrimSpace(out) == "64"
	})
	peak := stop()
	t.Logf("64 un-waited processes writing 6 MB each: shim RSS %d MB before, peak %d MB", before>>20, peak>>20)
	if peak > shimRSSBound {
		t.Fatalf("shim RSS peaked at %d MB with 64 un-waited processes' output, over the bound of %d MB", peak>>20, shimRSSBound>>20)
	}
	lap("(d) flood")
	// What they wrote is there for Wait: the end of it, marked truncated.
	for _, id := range []string{ids[0], ids[63]} {
		var res client.SelfResult
		out := must("flood", "branchctl", "self", "wait", "--json", b, id)
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
		if res.Code != 0 || !res.Truncated || len(res.Stdout) < 8<<10 || len(res.Stdout) > 1<<20 || len(res.Stderr) < 8<<10 {
			t.Fatalf("wait %s: code %d truncated %v, %d bytes of stdout, %d of stderr", id, res.Code, res.Truncated, len(res.Stdout), len(res.Stderr))
		}
	}
}

// TestInsockBoundsChurn: (b) 1,008 forks from inside a sandbox, 16 at a
// time (one branch, and 15 under it, aborted together), leave the host
// serving another sandbox and the shim's memory bounded.
func TestInsockBoundsChurn(t *testing.T) {
	ctx, env := boundsEnv(t)
	in := func(id string, args ...string) (string, error) { return execIn(ctx, env, id, args...) }
	runBoundedSandbox(t, ctx, env, "other")
	if _, err := in("other", "branchctl", "self", "fork", "-n", "2"); err != nil {
		t.Fatal(err)
	}
	runBoundedSandbox(t, ctx, env, "churn")
	shim := shimOf(t, env, "churn")
	stop := watchRSS(t, shim)
	done := make(chan error, 1)
	go func() {
		_, err := in("churn", "sh", "-c", `i=0
while [ $i -lt 63 ]; do
	b=$(branchctl self fork -n 1) || exit 1
	branchctl self fork --parent "$b" -n 15 >/dev/null || exit 1
	branchctl self abort "$b" >/dev/null || exit 1
	i=$((i+1))
done`)
		done <- err
	}()
	served := 0
	for loop := true; loop; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("1,008 forks from inside: %v", err)
			}
			loop = false
		case <-time.After(2 * time.Second):
			tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			out, errOut, code := branchctl(t, tctx, env, "", "tree", "other")
			cancel()
			if code != 0 {
				t.Fatalf("tree of another sandbox during the forks: %s %s", out, errOut)
			}
			served++
		}
	}
	if peak := stop(); peak > shimRSSBound {
		t.Fatalf("shim RSS peaked at %d MB over 1,008 in-sandbox forks, over the bound of %d MB", peak>>20, shimRSSBound>>20)
	} else {
		t.Logf("1,008 in-sandbox forks: shim RSS peak %d MB; the host answered %d trees meanwhile", peak>>20, served)
	}
	if n := liveBranches(t, ctx, env, "churn"); n != 0 || selfListeners(t, shim) != 1 || len(socketDirs(env, "churn")) != 1 {
		t.Fatalf("after the churn: %d live branches, %d listeners, socket dirs %v", n, selfListeners(t, shim), socketDirs(env, "churn"))
	}
}
