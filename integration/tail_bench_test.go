//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// tailOps is how many times BenchmarkTail times each operation
// (BENCH_TAIL_OPS, default 200: a p99 needs a hundred samples or more).
func tailOps(b *testing.B) int {
	return envInt(b, "BENCH_TAIL_OPS", 200)
}

// tailRest is the pause before each timed operation (BENCH_TAIL_REST,
// default 100ms, as the "rest" rows of BenchmarkContextForkSeccomp): the
// sandbox at rest, the previous operation's clean-up and pool refill done.
func tailRest(b *testing.B) time.Duration {
	s := os.Getenv("BENCH_TAIL_REST")
	if s == "" {
		return 100 * time.Millisecond
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		b.Fatalf("BENCH_TAIL_REST=%q: %v", s, err)
	}
	return d
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

// tailKind is one operation BenchmarkTail times.
type tailKind struct {
	name string
	// per divides each sample (a fork of 8 is reported per branch).
	per int
	// run does the operation's untimed set-up, then calls timed around
	// the operation itself, then its untimed tear-down.
	run func(timed func(func()))
	// soon: the operation follows its set-up at once; the pause
	// (BENCH_TAIL_REST) comes before the set-up instead.
	soon bool
}

// BenchmarkTail: the latency distribution (p50, p90, p99, max over
// BENCH_TAIL_OPS operations each) of what a user waits for on a running
// 10,000-file sandbox at rest: a fork of 1 branch, the same right after
// every file of the sandbox was looked up (the seal's remount drops the
// overlay's cached dentries, a cost that follows their number), a fork
// of 8 (per branch), a commit of a live branch holding a 1 KB change, an
// abort of a live branch, the same right after the fork of a sandbox that
// had just written 16 MB (op=abort-after-write: a superblock seal's remount
// syncs the upper filesystem, and the unseal waits for that; its pause
// comes before the writes), and a rollback of the sandbox to a checkpoint
// after a 1 KB change; beside two baselines timed in the same run: the null request
// (a call through client -> shim -> snapshotter that does nothing: list
// the sandbox's checkpoints, issue 17's "list-call") and a fork+exec+wait
// of /bin/true in a new PID and mount namespace (what a kernel-level
// fork of a sandbox cannot avoid). The operations are interleaved, one of
// each kind in turn, each after a pause (BENCH_TAIL_REST), so that the
// machine's drift falls on every row alike. Every row op=X shows the
// branch operation (impl=branch) beside the same two baseline samples
// (impl=null, impl=forkexec).
//
// The CLI rows: `branchctl fork` of 1 (its own start, flag parsing, the
// name's resolution through containerd and the dial of the shim
// included) against the Go client's fork over a kept connection
// (impl=go-client: the fork-1 samples) and with a new SandboxClient per
// fork (impl=go-client-dial); and branchctl's bare start (`branchctl
// completion bash`, which prints a constant) against an exec of
// /bin/true (impl=exec). BENCH_BRANCHCTL_BEFORE names another branchctl
// binary to time beside it in both (impl=cli-before), for a change to
// the CLI's start measured in one run.
//
// op=fork-abort-cpu: the CPU time a fork of 1 + abort cycle costs the
// project's processes together (the sandbox's shim and its reaped
// children, the snapshotter, and this client process), from their
// /proc stat and getrusage before and after BENCH_TAIL_OPS back-to-back
// cycles, as ns-cpu/cycle (and per process; containerd's, not in the
// sum, as ns-cpu-containerd/cycle).
//
// BENCH_TAIL_PERF=DIR records a perf profile per operation kind (the
// shim, the snapshotter, this process and containerd, sampled only while
// the operation runs) into DIR/<op>.data; perf's presence moves the
// figures, so take the table from a run without it.
//
// The rows report samples taken before them: the iteration count on
// their lines is the framework's, and means nothing.
func BenchmarkTail(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	const id = "btail"
	sc, _ := benchSandbox(b, ctx, env, id)
	ops, rest := tailOps(b), tailRest(b)
	ctl := filepath.Join(env.BinDir, "branchctl")
	before := os.Getenv("BENCH_BRANCHCTL_BEFORE")
	sandboxRootfs := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, id, "rootfs")
	branchRootfs := func(k string) string {
		return filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, id, "branches", k, "rootfs")
	}
	change := bytes.Repeat([]byte("x"), 1024)
	written := bytes.Repeat([]byte("w"), 16<<20)
	if _, err := sc.Checkpoint(ctx, "", "tail-base"); err != nil {
		b.Fatal(err)
	}
	fork := func(n int) []client.BranchInfo {
		kids, err := sc.Fork(ctx, client.ForkOptions{Count: n})
		if err != nil {
			b.Fatal(err)
		}
		return kids
	}
	cliFork := func(bin string) func(timed func(func())) {
		return func(timed func(func())) {
			var out []byte
			var err error
			timed(func() {
				out, err = exec.Command(bin, "--address", env.Address, "--namespace", env.Namespace, "--json", "fork", id).Output()
			})
			if err != nil {
				b.Fatalf("%s fork: %v %s", bin, err, out)
			}
			var kids []client.BranchInfo
			if err := json.Unmarshal(out, &kids); err != nil || len(kids) != 1 {
				b.Fatalf("%s fork printed %q: %v", bin, out, err)
			}
			abortAll(b, ctx, sc, kids)
		}
	}
	cliStart := func(bin string) func(timed func(func())) {
		return func(timed func(func())) {
			var err error
			timed(func() { err = exec.Command(bin, "completion", "bash").Run() })
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	kinds := []tailKind{
		{name: "fork-1", run: func(timed func(func())) {
			var kids []client.BranchInfo
			timed(func() { kids = fork(1) })
			abortAll(b, ctx, sc, kids)
		}},
		{name: "fork-1-looked-up", run: func(timed func(func())) {
			// Every file of the sandbox looked up, as a `git status` or a
			// `find` in it does, through the same overlay superblock.
			lookUpAll(b, filepath.Join(sandboxRootfs, "tree"))
			var kids []client.BranchInfo
			timed(func() { kids = fork(1) })
			abortAll(b, ctx, sc, kids)
		}},
		{name: "fork-8", per: 8, run: func(timed func(func())) {
			var kids []client.BranchInfo
			timed(func() { kids = fork(8) })
			abortAll(b, ctx, sc, kids)
		}},
		{name: "commit", run: func(timed func(func())) {
			k := fork(1)[0].ID
			// Written through the branch's mount, as its processes write.
			if err := os.WriteFile(filepath.Join(branchRootfs(k), "tail-change"), change, 0o644); err != nil {
				b.Fatal(err)
			}
			var err error
			timed(func() { _, err = sc.Commit(ctx, k) })
			if err != nil {
				b.Fatal(err)
			}
		}},
		{name: "abort", run: func(timed func(func())) {
			k := fork(1)[0].ID
			var err error
			timed(func() { _, err = sc.Abort(ctx, k) })
			if err != nil {
				b.Fatal(err)
			}
		}},
		{name: "abort-after-write", soon: true, run: func(timed func(func())) {
			// 16 MB written through the sandbox's rootfs (a build, an
			// install), a fork, and its abort at once: a superblock seal
			// syncs the upper filesystem after its read-only point, and
			// the abort's unseal waits for that sync.
			time.Sleep(rest)
			if err := os.WriteFile(filepath.Join(sandboxRootfs, "tail-written"), written, 0o644); err != nil {
				b.Fatal(err)
			}
			k := fork(1)[0].ID
			var err error
			timed(func() { _, err = sc.Abort(ctx, k) })
			if err != nil {
				b.Fatal(err)
			}
			// Gone before the rollback's turn, whose change is 1 KB.
			if err := os.Remove(filepath.Join(sandboxRootfs, "tail-written")); err != nil {
				b.Fatal(err)
			}
		}},
		{name: "rollback-1KB", run: func(timed func(func())) {
			if err := os.WriteFile(filepath.Join(sandboxRootfs, "tail-rollback"), change, 0o644); err != nil {
				b.Fatal(err)
			}
			var err error
			timed(func() { err = sc.Rollback(ctx, "", "tail-base") })
			if err != nil {
				b.Fatal(err)
			}
		}},
		{name: "null", run: func(timed func(func())) {
			var err error
			timed(func() { _, err = sc.Checkpoints(ctx) })
			if err != nil {
				b.Fatal(err)
			}
		}},
		{name: "forkexec", run: func(timed func(func())) {
			cmd := exec.Command("/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
			var err error
			timed(func() { err = cmd.Run() })
			if err != nil {
				b.Fatal(err)
			}
		}},
		{name: "cli-fork", run: cliFork(ctl)},
		{name: "go-client-dial", run: func(timed func(func())) {
			var kids []client.BranchInfo
			var err error
			timed(func() {
				var c *client.SandboxClient
				if c, err = client.NewSandboxClient(ctx, env.Address, env.Namespace, id); err != nil {
					return
				}
				defer c.Close()
				kids, err = c.Fork(ctx, client.ForkOptions{Count: 1})
			})
			if err != nil {
				b.Fatal(err)
			}
			abortAll(b, ctx, sc, kids)
		}},
		{name: "cli-start", run: cliStart(ctl)},
		{name: "exec", run: func(timed func(func())) {
			var err error
			timed(func() { err = exec.Command("/bin/true").Run() })
			if err != nil {
				b.Fatal(err)
			}
		}},
	}
	if before != "" {
		kinds = append(kinds, tailKind{name: "cli-fork-before", run: cliFork(before)}, tailKind{name: "cli-start-before", run: cliStart(before)})
	}
	var prof *tailProfiler
	if dir := os.Getenv("BENCH_TAIL_PERF"); dir != "" {
		prof = startTailProfiler(b, dir, kinds, shimPidOf(b, env, id), env.SnapshotterPid(), os.Getpid(), env.ContainerdPid())
	}

	samples := map[string][]time.Duration{}
	quiesce(b)
	for i := 0; i < ops; i++ {
		for _, k := range kinds {
			k.run(func(op func()) {
				if !k.soon {
					time.Sleep(rest)
				}
				prof.enable(b, k.name)
				t0 := time.Now()
				op()
				d := time.Since(t0)
				prof.disable(b, k.name)
				samples[k.name] = append(samples[k.name], d/time.Duration(max(k.per, 1)))
			})
		}
	}
	cpu := tailCPU(b, ctx, env, sc, id, ops)

	report := func(name string, each []time.Duration) {
		b.Run(name, func(b *testing.B) { reportTail(b, each) })
	}
	for _, op := range []string{"fork-1", "fork-1-looked-up", "fork-8", "commit", "abort", "abort-after-write", "rollback-1KB"} {
		report("op="+op+"/impl=branch", samples[op])
		report("op="+op+"/impl=null", samples["null"])
		report("op="+op+"/impl=forkexec", samples["forkexec"])
	}
	report("op=cli-fork-1/impl=branch", samples["cli-fork"])
	report("op=cli-fork-1/impl=go-client", samples["fork-1"])
	report("op=cli-fork-1/impl=go-client-dial", samples["go-client-dial"])
	report("op=cli-start/impl=branch", samples["cli-start"])
	report("op=cli-start/impl=exec", samples["exec"])
	if before != "" {
		report("op=cli-fork-1/impl=cli-before", samples["cli-fork-before"])
		report("op=cli-start/impl=cli-before", samples["cli-start-before"])
	}
	b.Run("op=fork-abort-cpu/impl=branch", func(b *testing.B) {
		for unit, v := range cpu {
			b.ReportMetric(v, unit)
		}
		b.ReportMetric(0, "ns/op")
	})
}

// lookUpAll stats every entry of dir, so that the kernel caches a dentry
// for each.
func lookUpAll(b *testing.B, dir string) {
	b.Helper()
	names, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(dir, n.Name())); err != nil {
			b.Fatal(err)
		}
	}
}

// reportTail reports each's mean as ns/op and its p50, p90, p99 and max
// (nearest rank).
func reportTail(b *testing.B, each []time.Duration) {
	s := slices.Clone(each)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	rank := func(p float64) time.Duration {
		return s[max(int(math.Ceil(p*float64(len(s))))-1, 0)]
	}
	b.ReportMetric(float64(sum.Nanoseconds())/float64(len(s)), "ns/op")
	b.ReportMetric(float64(rank(0.50).Nanoseconds()), "ns/p50")
	b.ReportMetric(float64(rank(0.90).Nanoseconds()), "ns/p90")
	b.ReportMetric(float64(rank(0.99).Nanoseconds()), "ns/p99")
	b.ReportMetric(float64(s[len(s)-1].Nanoseconds()), "ns/max")
}

// shimPidOf finds the shim serving sandbox id among this env's shims (by
// its -id argument), never by name.
func shimPidOf(b *testing.B, env *daemons.Env, id string) int {
	b.Helper()
	for _, pid := range env.ShimPids() {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(raw), "\x00")
		if i := slices.Index(args, "-id"); i >= 0 && i+1 < len(args) && args[i+1] == id {
			return pid
		}
	}
	b.Fatalf("no shim of this env serves %s", id)
	return 0
}

// procCPU is a process's CPU time (user and system) in nanoseconds, its
// own and that of the children it has reaped, from /proc/PID/stat.
func procCPU(b *testing.B, pid int) (self, children time.Duration) {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name may hold spaces: the fields follow its ")".
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 15 {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	ticks := func(i int) uint64 { // f[0] is field 3 (state)
		v, err := strconv.ParseUint(f[i-3], 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat field %d: %v", pid, i, err)
		}
		return v
	}
	const hz = 100 // USER_HZ, fixed by the kernel's ABI
	tick := time.Second / hz
	return time.Duration(ticks(14)+ticks(15)) * tick, time.Duration(ticks(16)+ticks(17)) * tick
}

func selfCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tailCPU runs n fork of 1 + abort cycles back to back and returns what
// they cost the project's processes in CPU per cycle, by unit. The
// counters are read again only once the machine is quiet after the last
// cycle: the clean-up an abort leaves to the background is the cycle's
// too. (/proc counts in clock ticks of 10 ms: n cycles make it exact
// enough.)
func tailCPU(b *testing.B, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, id string, n int) map[string]float64 {
	shim, snap, ctrd := shimPidOf(b, env, id), env.SnapshotterPid(), env.ContainerdPid()
	quiesce(b)
	shim0, shimKids0 := procCPU(b, shim)
	snap0, _ := procCPU(b, snap)
	ctrd0, _ := procCPU(b, ctrd)
	self0 := selfCPU(b)
	for i := 0; i < n; i++ {
		kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
		if err != nil {
			b.Fatal(err)
		}
		abortAll(b, ctx, sc, kids)
	}
	self1 := selfCPU(b) // before quiesce, whose own reads are not the client's work
	quiesce(b)
	shim1, shimKids1 := procCPU(b, shim)
	snap1, _ := procCPU(b, snap)
	ctrd1, _ := procCPU(b, ctrd)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	out := map[string]float64{
		"ns-cpu-shim/cycle":          per(shim1 - shim0),
		"ns-cpu-shim-children/cycle": per(shimKids1 - shimKids0),
		"ns-cpu-snapshotter/cycle":   per(snap1 - snap0),
		"ns-cpu-client/cycle":        per(self1 - self0),
	}
	out["ns-cpu/cycle"] = out["ns-cpu-shim/cycle"] + out["ns-cpu-shim-children/cycle"] + out["ns-cpu-snapshotter/cycle"] + out["ns-cpu-client/cycle"]
	// Not the project's, but on the path of what the shim reports.
	out["ns-cpu-containerd/cycle"] = per(ctrd1 - ctrd0)
	return out
}

// tailProfiler is one perf record per operation kind, attached to the
// project's processes and sampling only while an operation of its kind
// runs (perf's --control fifos; -D -1 starts it disabled).
type tailProfiler struct {
	perf map[string]*perfRecord
}

type perfRecord struct {
	cmd      *exec.Cmd
	ctl, ack *os.File
	ackR     *bufio.Reader
	fifos    []string
}

func startTailProfiler(b *testing.B, dir string, kinds []tailKind, pids ...int) *tailProfiler {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var ps []string
	for _, p := range pids {
		ps = append(ps, strconv.Itoa(p))
	}
	t := &tailProfiler{perf: map[string]*perfRecord{}}
	// Also the ones started before a failure.
	b.Cleanup(func() { t.stop(b) })
	for _, k := range kinds {
		ctl, ack := filepath.Join(dir, k.name+".ctl"), filepath.Join(dir, k.name+".ack")
		for _, f := range []string{ctl, ack} {
			_ = os.Remove(f)
			if err := unix.Mkfifo(f, 0o600); err != nil {
				b.Fatal(err)
			}
		}
		cmd := exec.Command("perf", "record", "-q", "-F", "4999", "-g", "-D", "-1", "--control", "fifo:"+ctl+","+ack,
			"-o", filepath.Join(dir, k.name+".data"), "-p", strings.Join(ps, ","))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		r := &perfRecord{cmd: cmd, fifos: []string{ctl, ack}}
		t.perf[k.name] = r
		var err error
		// Read-write, so that neither open waits for perf (a perf that
		// failed to start would hold it forever); command's deadline on
		// the ack tells a perf that does not answer.
		if r.ctl, err = os.OpenFile(ctl, os.O_RDWR, 0); err != nil {
			b.Fatal(err)
		}
		if r.ack, err = os.OpenFile(ack, os.O_RDWR, 0); err != nil {
			b.Fatal(err)
		}
		r.ackR = bufio.NewReader(r.ack)
	}
	return t
}

// command sends perf a control command and waits for its ack, so that
// the sampling is on (or off) before the operation starts (ends).
func (t *tailProfiler) command(b *testing.B, kind, what string) {
	if t == nil {
		return
	}
	r := t.perf[kind]
	if _, err := r.ctl.WriteString(what + "\n"); err != nil {
		b.Fatal(err)
	}
	if err := r.ack.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		b.Fatal(err)
	}
	if _, err := r.ackR.ReadString('\n'); err != nil {
		b.Fatalf("perf record for %s did not acknowledge %q: %v", kind, what, err)
	}
}

func (t *tailProfiler) enable(b *testing.B, kind string)  { t.command(b, kind, "enable") }
func (t *tailProfiler) disable(b *testing.B, kind string) { t.command(b, kind, "disable") }

// stop ends every perf record (SIGINT, on which it writes its file) and
// waits for it.
func (t *tailProfiler) stop(b *testing.B) {
	for name, r := range t.perf {
		_ = r.cmd.Process.Signal(os.Interrupt)
		if err := r.cmd.Wait(); err != nil {
			b.Logf("perf record %s: %v", name, err)
		}
		r.ctl.Close()
		r.ack.Close()
		for _, f := range r.fifos {
			_ = os.Remove(f)
		}
	}
}
