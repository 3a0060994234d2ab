//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// benchSandbox runs a sandbox on the branch runtime and snapshotter whose
// rootfs holds 10,000 more files (the size the fork targets are set for),
// and returns a branch client and its rootfs upper directory.
// extra are more flags for ctr run.
func benchSandbox(b *testing.B, ctx context.Context, env *daemons.Env, id string, extra ...string) (*client.SandboxClient, string) {
	b.Helper()
	args := append([]string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch"}, extra...)
	args = append(args, ociimage.ImageRef, id,
		"sh", "-c", "mkdir -p /tree && cd /tree && seq 1 10000 | xargs touch && touch /ready && exec sleep 100000")
	if _, err := env.Ctr(ctx, args...); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { benchRemoveCtr(env, id) })
	sc := readyBenchSandbox(b, ctx, env, id, "/ready")
	upper, err := env.RootfsUpperdir(id)
	if err != nil {
		b.Fatal(err)
	}
	return sc, upper
}

func benchRemoveCtr(env *daemons.Env, id string) {
	ctx := context.Background()
	_, _ = env.Ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
	for i := 0; i < 100; i++ {
		if _, err := env.Ctr(ctx, "tasks", "delete", id); err == nil || strings.Contains(err.Error(), "not found") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, _ = env.Ctr(ctx, "containers", "delete", id)
}

// copyFork is the baseline "fork by copy": a new overlayfs snapshot of the
// image, the sandbox's upper layer copied into it (cp -a), and a new
// container started on it with runc-v2.
type copyFork struct {
	c     containerd.Container
	task  containerd.Task
	upper string
}

func startCopy(b *testing.B, ctx context.Context, cc *containerd.Client, sandboxUpper, id string) copyFork {
	b.Helper()
	img, err := cc.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		b.Fatal(err)
	}
	c, err := cc.NewContainer(ctx, id, containerd.WithSnapshotter("overlayfs"), containerd.WithNewSnapshot(id, img),
		containerd.WithRuntime("io.containerd.runc.v2", nil),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sleep", "100000")))
	if err != nil {
		b.Fatal(err)
	}
	ms, err := cc.SnapshotService("overlayfs").Mounts(ctx, id)
	if err != nil {
		b.Fatal(err)
	}
	upper := ""
	for _, o := range ms[0].Options {
		if u, ok := strings.CutPrefix(o, "upperdir="); ok {
			upper = u
		}
	}
	if out, err := exec.Command("cp", "-a", sandboxUpper+"/.", upper+"/").CombinedOutput(); err != nil {
		b.Fatalf("cp: %v %s", err, out)
	}
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		b.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		b.Fatal(err)
	}
	return copyFork{c: c, task: task, upper: upper}
}

// settle has containerd collect the snapshots a baseline removed (a
// synchronous garbage collection, which removes their 10,000-file trees)
// and writes everything out, so that the next benchmark does not run
// during that work: its own syncs (a seal's, a commit's decision) would
// wait for it.
func settle(b *testing.B, ctx context.Context, cc *containerd.Client) {
	b.Helper()
	ls := cc.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID())
	if err != nil {
		b.Fatal(err)
	}
	if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil {
		b.Fatal(err)
	}
	unix.Sync()
}

func (f copyFork) remove(b *testing.B, ctx context.Context) {
	benchRemove(b, ctx, f.c, f.task)
}

func abortAll(b *testing.B, ctx context.Context, sc *client.SandboxClient, kids []client.BranchInfo) {
	b.Helper()
	for _, k := range kids {
		if _, err := sc.Abort(ctx, k.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkContextFork: fork of n branches of a running 10,000-file
// sandbox, each with its init running, against fork by copy.
func BenchmarkContextFork(b *testing.B) {
	ctx, env, cc, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	sc, upper := benchSandbox(b, ctx, env, "bfork")
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("n=%d/impl=branch", n), func(b *testing.B) {
			benchForks(b, ctx, sc, n, 0)
		})
		if n > 8 {
			continue // 64 copies of 10,000 files per iteration is minutes
		}
		b.Run(fmt.Sprintf("n=%d/impl=copy", n), func(b *testing.B) {
			i := 0
			quiesce(b)
			for b.Loop() {
				var fs []copyFork
				for j := 0; j < n; j++ {
					fs = append(fs, startCopy(b, ctx, cc, upper, fmt.Sprintf("cp-%d-%d-%d", n, i, j)))
				}
				i++
				b.StopTimer()
				for _, f := range fs {
					f.remove(b, ctx)
				}
				b.StartTimer()
			}
			settle(b, ctx, cc)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/branch")
		})
	}
}

// openFilesWorkload is run in a sandbox to hold 10 files of its rootfs
// open for writing and 10 unlinked while open, each by a process of its
// own, as a dev server, a database and replaced binaries would.
const openFilesWorkload = "for i in 1 2 3 4 5 6 7 8 9 10; do " +
	"(exec 3>>/w$i; exec sleep 100000) & " +
	"(echo x > /u$i; exec 3</u$i; rm /u$i; exec sleep 100000) & " +
	"done; sleep 0.5; touch /open.ready"

// unlinkedWorkload holds only 10 files unlinked while open: the seal is
// made mount by mount.
const unlinkedWorkload = "for i in 1 2 3 4 5 6 7 8 9 10; do " +
	"(echo x > /u$i; exec 3</u$i; rm /u$i; exec sleep 100000) & " +
	"done; sleep 0.5; touch /open.ready"

// BenchmarkContextForkOpenFiles: fork of n branches of a running
// 10,000-file sandbox whose processes hold 10 files open for writing and
// 10 unlinked while open (impl=branch: the default seal freezes them),
// against the same fork of a sandbox holding none (impl=plain), in the
// same run. Target: at most 1.5x plain, per branch. The other rows (which
// benchtable shows as more baselines of impl=branch): a sandbox holding
// only 10 files unlinked while open (impl=unlinked: sealed mount by
// mount), and --seal freeze of the plain and open-files sandboxes.
func BenchmarkContextForkOpenFiles(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	plain, _ := benchSandbox(b, ctx, env, "bplain")
	open, _ := benchSandbox(b, ctx, env, "bopen")
	unlinked, _ := benchSandbox(b, ctx, env, "bunlinked")
	for id, workload := range map[string]string{"bopen": openFilesWorkload, "bunlinked": unlinkedWorkload} {
		if _, err := env.Ctr(ctx, "tasks", "exec", "--exec-id", "open", id, "sh", "-c", "("+workload+") </dev/null >/dev/null 2>&1 &"); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := env.Ctr(ctx, "tasks", "exec", "--exec-id", "openready", id, "test", "-e", "/open.ready"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("open files workload did not start")
			}
		}
	}
	for _, n := range []int{1, 8} {
		for _, tc := range []struct {
			impl, seal string
			sc         *client.SandboxClient
		}{{"plain", "", plain}, {"branch", "", open}, {"unlinked", "", unlinked}, {"plain-freeze", "freeze", plain}, {"openfiles-freeze", "freeze", open}} {
			b.Run(fmt.Sprintf("n=%d/impl=%s", n, tc.impl), func(b *testing.B) {
				quiesce(b)
				for b.Loop() {
					kids, err := tc.sc.Fork(ctx, client.ForkOptions{Count: n, Seal: tc.seal})
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					abortAll(b, ctx, tc.sc, kids)
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/branch")
			})
		}
	}
}

// BenchmarkContextForkSeccomp: fork of n branches of a running 10,000-file
// sandbox with containerd's default seccomp profile (ctr run --seccomp:
// what nerdctl and the CRI's RuntimeDefault give), whose branches the
// branch init starts with the filter, against the same fork of an
// unconfined sandbox (impl=unconfined), and of a default-profile sandbox
// whose branches the runtime starts (impl=runtime: CAP_SYS_PTRACE in its
// bounding set keeps them off the init, as seccomp did before).
func BenchmarkContextForkSeccomp(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	sandboxes := []struct {
		impl string
		args []string
	}{
		{"unconfined", nil},
		{"branch", []string{"--seccomp"}},
		{"runtime", []string{"--seccomp", "--cap-add", "CAP_SYS_PTRACE"}},
	}
	scs := map[string]*client.SandboxClient{}
	for _, s := range sandboxes {
		scs[s.impl], _ = benchSandbox(b, ctx, env, "bsec-"+s.impl, s.args...)
	}
	// The runtime's rows come last: the containers they start and delete
	// leave work behind that would fall on whichever row came next.
	// The "rest" rows fork 1 of a sandbox at rest (100 ms after the
	// previous abort): the latency one fork has, apart from the clean-up
	// of the one before, which the back-to-back rows share the CPUs with.
	// Each timed fork of the default-profile and unconfined sandboxes
	// comes after an untimed one of the other (alternate): both rows then
	// meet the same clean-up before each fork, whatever their order, and
	// the ratio of the two is not the order's (for 8 branches, forking
	// each sandbox alone, the median ratio was 1.20x with the unconfined
	// row first and 1.04x with it second).
	rows := []struct {
		n               int
		impl, alternate string
		rest            time.Duration
	}{{1, "unconfined", "branch", 0}, {1, "branch", "unconfined", 0},
		{8, "unconfined", "branch", 0}, {8, "branch", "unconfined", 0},
		{1, "unconfined", "branch", 100 * time.Millisecond}, {1, "branch", "unconfined", 100 * time.Millisecond},
		{1, "runtime", "", 0}, {8, "runtime", "", 0}}
	for _, r := range rows {
		n, sc, other := r.n, scs[r.impl], scs[r.alternate]
		name := fmt.Sprintf("n=%d/impl=%s", n, r.impl)
		if r.rest > 0 {
			name = "rest/" + name
		}
		b.Run(name, func(b *testing.B) {
			benchForksAlternate(b, ctx, sc, other, n, r.rest)
		})
	}
	// Not a way to fork but the machine's yardstick: a call that goes
	// through the shim to the snapshotter and back doing almost nothing
	// (list the sandbox's checkpoints: none), at rest as the fork above.
	// It wakes four sleeping processes in turn (client, shim, snapshotter,
	// shim, client) where a fork wakes six: what this machine's wake-ups
	// cost on the day, beside the fork. (A tree call walks the sandbox's
	// upper directory for its size: tens of milliseconds here.)
	b.Run("rest/n=1/impl=list-call", func(b *testing.B) {
		sc := scs["branch"]
		quiesce(b)
		var each []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if _, err := sc.Checkpoints(ctx); err != nil {
				b.Fatal(err)
			}
			each = append(each, time.Since(t0))
			b.StopTimer()
			time.Sleep(100 * time.Millisecond)
			b.StartTimer()
		}
		reportPerBranch(b, each, 1)
	})
}

// BenchmarkContextExec: exec of `true` in a branch to its exit status,
// against the same in a runc-v2 container.
func BenchmarkContextExec(b *testing.B) {
	ctx, env, cc, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	sc, upper := benchSandbox(b, ctx, env, "bexec")
	b.Run("impl=branch", func(b *testing.B) {
		k, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
		if err != nil {
			b.Fatal(err)
		}
		defer abortAll(b, ctx, sc, k)
		quiesce(b)
		for b.Loop() {
			if st, err := sc.Run(ctx, k[0].ID, client.ExecOptions{Args: []string{"true"}}); err != nil || st.Code != 0 {
				b.Fatal(st, err)
			}
		}
	})
	b.Run("impl=copy", func(b *testing.B) {
		f := startCopy(b, ctx, cc, upper, "cp-exec")
		defer settle(b, ctx, cc)
		defer f.remove(b, ctx)
		spec, err := f.task.Spec(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ps := *spec.Process
		ps.Args = []string{"true"}
		i := 0
		quiesce(b)
		for b.Loop() {
			p, err := f.task.Exec(ctx, fmt.Sprintf("e%d", i), &ps, cio.NullIO)
			i++
			if err != nil {
				b.Fatal(err)
			}
			ch, err := p.Wait(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Start(ctx); err != nil {
				b.Fatal(err)
			}
			<-ch
			if _, err := p.Delete(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkContextCommit: commit of a 1 KB change end to end (the winner's
// processes killed, its changes applied through the sandbox's live mount);
// fork by copy "commits" by copying its upper layer back into the
// sandbox's and removing the copy.
func BenchmarkContextCommit(b *testing.B) {
	ctx, env, cc, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	sc, upper := benchSandbox(b, ctx, env, "bcommit")
	b.Run("impl=branch", func(b *testing.B) {
		quiesce(b)
		for b.Loop() {
			b.StopTimer()
			k, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
			if err != nil {
				b.Fatal(err)
			}
			if st, err := sc.Run(ctx, k[0].ID, client.ExecOptions{Args: []string{"sh", "-c", "head -c 1024 /dev/urandom > /change"}}); err != nil || st.Code != 0 {
				b.Fatal(st, err)
			}
			b.StartTimer()
			if _, err := sc.Commit(ctx, k[0].ID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=copy", func(b *testing.B) {
		i := 0
		quiesce(b)
		for b.Loop() {
			b.StopTimer()
			f := startCopy(b, ctx, cc, upper, fmt.Sprintf("cp-commit-%d", i))
			i++
			if err := os.WriteFile(filepath.Join(f.upper, "change"), make([]byte, 1024), 0o644); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if out, err := exec.Command("cp", "-a", f.upper+"/.", upper+"/").CombinedOutput(); err != nil {
				b.Fatalf("cp back: %v %s", err, out)
			}
			f.remove(b, ctx)
		}
		settle(b, ctx, cc)
	})
}

// BenchmarkContextAbort: abort of a branch with its init running, against
// removing a copy.
func BenchmarkContextAbort(b *testing.B) {
	ctx, env, cc, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	sc, upper := benchSandbox(b, ctx, env, "babort")
	b.Run("impl=branch", func(b *testing.B) {
		quiesce(b)
		for b.Loop() {
			b.StopTimer()
			k, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			abortAll(b, ctx, sc, k)
		}
	})
	b.Run("impl=copy", func(b *testing.B) {
		i := 0
		quiesce(b)
		for b.Loop() {
			b.StopTimer()
			f := startCopy(b, ctx, cc, upper, fmt.Sprintf("cp-abort-%d", i))
			i++
			b.StartTimer()
			f.remove(b, ctx)
		}
		settle(b, ctx, cc)
	})
}

const readSize = 256 << 20

// readAll reads a file sequentially in 1 MiB reads.
func readAll(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		m, err := f.Read(buf)
		n += int64(m)
		if err != nil {
			break
		}
	}
	if n != readSize {
		b.Fatalf("read %d bytes of %s, want %d", n, path, readSize)
	}
}

// BenchmarkContextRead: sequential read of a 256 MiB file (page cache warm)
// through a branch's overlay mount against the same file read on the host
// filesystem (the sandbox's upper directory, where it lives). The branch's
// mount is read from the host at its mount point: the same superblock the
// branch's processes read, without an exec in the timing.
//
// Both sides take turns read by read, in each sub-benchmark, and each
// reports the median of its own reads: on a shared machine, throughput
// drifts by 10% from one second to the next, which two back-to-back runs
// of one side each would take for a difference between them.
func BenchmarkContextRead(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	sc, upper := benchSandbox(b, ctx, env, "bread")
	if _, err := env.Ctr(ctx, "tasks", "exec", "--exec-id", "mk", "bread", "dd", "if=/dev/zero", "of=/big", "bs=1M", fmt.Sprintf("count=%d", readSize>>20)); err != nil {
		b.Fatal(err)
	}
	// Written out before either side reads: otherwise the first side read
	// (the branch) runs while the kernel writes back 256 MiB of dirty pages.
	syncFile(b, filepath.Join(upper, "big"))
	k, err := sc.Fork(ctx, client.ForkOptions{Count: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer abortAll(b, ctx, sc, k)
	inBranch := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "bread", "branches", k[0].ID, "rootfs", "big")
	onHost := filepath.Join(upper, "big")
	for _, tc := range []struct{ impl, path, other string }{{"branch", inBranch, onHost}, {"host", onHost, inBranch}} {
		b.Run("impl="+tc.impl, func(b *testing.B) {
			readAll(b, tc.path) // warm; the other side is read before each timed read
			var ds []time.Duration
			quiesce(b)
			for b.Loop() {
				b.StopTimer()
				readAll(b, tc.other)
				b.StartTimer()
				t0 := time.Now()
				readAll(b, tc.path)
				ds = append(ds, time.Since(t0))
			}
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			med := ds[len(ds)/2]
			b.ReportMetric(float64(med.Nanoseconds()), "ns/op")
			b.ReportMetric(float64(readSize)/1e6/med.Seconds(), "MB/s")
		})
	}
}

func syncFile(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
}

// cachedBytes is how much of a file is in the page cache (mincore).
func cachedBytes(b *testing.B, path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if fi.Size() == 0 {
		return 0
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(data)
	page := os.Getpagesize()
	vec := make([]byte, (len(data)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		b.Fatal(errno)
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += int64(page)
		}
	}
	return n
}

// evict drops a file's pages from the page cache (only this file's: the
// machine is shared, so no drop_caches).
func evict(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// BenchmarkContextPageCache: page-cache growth when 16 branches read the
// same 100 MiB file, against one branch reading it: overlayfs serves every
// branch from the one lower inode, so the cache holds it once. Reported as
// cached-bytes (the file's resident pages after the reads, by mincore,
// over every inode a branch could have read through) per run.
func BenchmarkContextPageCache(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	sc, upper := benchSandbox(b, ctx, env, "bcache")
	if _, err := env.Ctr(ctx, "tasks", "exec", "--exec-id", "mk", "bcache", "dd", "if=/dev/urandom", "of=/shared", "bs=1M", "count=100"); err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(upper, "shared")
	for _, n := range []int{16, 1} {
		impl := "branch"
		if n == 1 {
			impl = "one"
		}
		b.Run("impl="+impl, func(b *testing.B) {
			var cached int64
			quiesce(b)
			for b.Loop() {
				b.StopTimer()
				kids, err := sc.Fork(ctx, client.ForkOptions{Count: n})
				if err != nil {
					b.Fatal(err)
				}
				evict(b, file)
				b.StartTimer()
				for _, k := range kids {
					if st, err := sc.Run(ctx, k.ID, client.ExecOptions{Args: []string{"cat", "/shared"}}); err != nil || st.Code != 0 {
						b.Fatal(st, err)
					}
				}
				b.StopTimer()
				cached += cachedBytes(b, file)
				abortAll(b, ctx, sc, kids)
				b.StartTimer()
			}
			b.ReportMetric(float64(cached)/float64(b.N), "cached-bytes")
		})
	}
}

// benchForks times forks of n branches of sc, each aborted untimed, and
// reports the time per branch. With rest, each fork comes that long after
// the previous one's abort (untimed): the sandbox at rest, its clean-up
// and its pool's refill done, as an agent that works in its branches for
// a while before it forks again finds it; without, the forks come back to
// back and each shares the CPUs with the previous one's clean-up. Besides
// the mean it reports the median fork (ns/branch-p50), which a few forks
// that met the machine's other work do not move.
func benchForks(b *testing.B, ctx context.Context, sc *client.SandboxClient, n int, rest time.Duration) {
	benchForksAlternate(b, ctx, sc, nil, n, rest)
}

// benchForksAlternate is benchForks with, if other is not nil, an untimed
// fork of n branches of other, aborted (and rest after it), before each
// timed fork of sc.
func benchForksAlternate(b *testing.B, ctx context.Context, sc, other *client.SandboxClient, n int, rest time.Duration) {
	quiesce(b)
	var each []time.Duration
	for b.Loop() {
		if other != nil {
			b.StopTimer()
			kids, err := other.Fork(ctx, client.ForkOptions{Count: n})
			if err != nil {
				b.Fatal(err)
			}
			abortAll(b, ctx, other, kids)
			time.Sleep(rest)
			b.StartTimer()
		}
		t0 := time.Now()
		kids, err := sc.Fork(ctx, client.ForkOptions{Count: n})
		each = append(each, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		abortAll(b, ctx, sc, kids)
		time.Sleep(rest)
		b.StartTimer()
	}
	reportPerBranch(b, each, n)
}

// reportPerBranch reports the mean time per branch of the timed part of
// b's loop, whose iterations took each and made n branches apiece, and the
// median iteration's.
func reportPerBranch(b *testing.B, each []time.Duration, n int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/branch")
	slices.Sort(each)
	b.ReportMetric(float64(each[len(each)/2].Nanoseconds())/float64(n), "ns/branch-p50")
}

// readyBenchSandbox waits (60 s at most) until the benchmark's sandbox id
// has made the file ready, then dials it.
func readyBenchSandbox(b *testing.B, ctx context.Context, env *daemons.Env, id, ready string) *client.SandboxClient {
	b.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := env.Ctr(ctx, "tasks", "exec", "--exec-id", "ready", id, "test", "-e", ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("bench sandbox %s did not get ready (no %s)", id, ready)
		}
	}
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sc.Close() })
	return sc
}
