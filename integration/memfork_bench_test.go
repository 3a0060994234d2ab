//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// dirtySource is a process holding MB megabytes of dirty anonymous memory
// (every page written), and little else: static, no runtime of its own.
const dirtySource = `#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
	long n = atol(argv[1]) << 20;
	char *p = malloc(n);
	for (long i = 0; i < n; i += 4096) p[i] = (char)(i >> 12);
	if (argc > 2) close(creat(argv[2], 0644));
	for (;;) pause();
}
`

// buildDirty compiles dirtySource, static, into dir.
func buildDirty(b *testing.B, dir string) string {
	b.Helper()
	src := filepath.Join(dir, "dirty.c")
	bin := filepath.Join(dir, "dirty")
	if err := os.WriteFile(src, []byte(dirtySource), 0o644); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-static", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		b.Fatalf("gcc: %v: %s", err, out)
	}
	return bin
}

const dirtyImage = "docker.io/branchbox/dirty:bench"

// BenchmarkMemoryFork: a memory fork of n branches of a sandbox whose one
// process holds mb megabytes of dirty memory (impl=branch), per branch,
// beside, in the same run: a plain fork of the same sandbox (impl=plain),
// CRIU's dump and n restores of the same program run by hand on the host
// in a PID namespace of its own (impl=criu), and a copy of the dirty
// memory, n times (impl=memcpy, the floor). ns/pause is how long the
// source was stopped (CRIU's freezing and frozen time).
func BenchmarkMemoryFork(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	dir := b.TempDir()
	bin := buildDirty(b, dir)
	data, err := os.ReadFile(bin)
	if err != nil {
		b.Fatal(err)
	}
	importDirtyImage(b, ctx, env, data)
	for _, mb := range []int{1, 100} {
		id := fmt.Sprintf("bmem%d", mb)
		sc := dirtySandbox(b, ctx, env, id, mb)
		for _, n := range []int{1, 8} {
			name := fmt.Sprintf("mb=%d/n=%d", mb, n)
			b.Run(name+"/impl=branch", func(b *testing.B) { benchMemoryForks(b, ctx, sc, n, true) })
			b.Run(name+"/impl=plain", func(b *testing.B) { benchMemoryForks(b, ctx, sc, n, false) })
			b.Run(name+"/impl=criu", func(b *testing.B) { benchCriuByHand(b, env, bin, mb, n) })
			b.Run(name+"/impl=memcpy", func(b *testing.B) {
				src := make([]byte, mb<<20)
				for i := range src {
					src[i] = byte(i)
				}
				dst := make([]byte, len(src))
				for b.Loop() {
					for range n {
						copy(dst, src)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/branch")
			})
		}
	}
}

func importDirtyImage(b *testing.B, ctx context.Context, env *daemons.Env, data []byte) {
	b.Helper()
	base, err := ociimage.BusyboxLayer()
	if err != nil {
		b.Fatal(err)
	}
	layer, err := ociimage.FileLayer("bin/dirty", 0o755, data)
	if err != nil {
		b.Fatal(err)
	}
	archive := filepath.Join(b.TempDir(), "dirty.tar")
	f, err := os.Create(archive)
	if err != nil {
		b.Fatal(err)
	}
	err = ociimage.WriteImage(f, dirtyImage, ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/"}, base, layer)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "images", "import", "--snapshotter", "branch", archive); err != nil {
		b.Fatal(err)
	}
}

// dirtySandbox runs the dirty program as a sandbox's init.
func dirtySandbox(b *testing.B, ctx context.Context, env *daemons.Env, id string, mb int) *client.SandboxClient {
	b.Helper()
	if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", dirtyImage, id, "/bin/dirty", strconv.Itoa(mb), "/dev/shm/ready"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { benchRemoveCtr(env, id) })
	return readyBenchSandbox(b, ctx, env, id, "/dev/shm/ready")
}

// benchMemoryForks times forks of n branches of sc, with their memory or
// without, each aborted untimed.
func benchMemoryForks(b *testing.B, ctx context.Context, sc *client.SandboxClient, n int, memory bool) {
	quiesce(b)
	var each, pauses, dumps, restores []time.Duration
	for b.Loop() {
		t0 := time.Now()
		res, err := sc.ForkResult(ctx, client.ForkOptions{Count: n, WithMemory: memory})
		each = append(each, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		if res.Memory != nil {
			pauses = append(pauses, res.Memory.Pause)
			dumps = append(dumps, res.Memory.Dump)
			restores = append(restores, res.Memory.Restore)
		}
		b.StopTimer()
		abortAll(b, ctx, sc, res.Branches)
		b.StartTimer()
	}
	reportPerBranch(b, each, n)
	// Where a memory fork's time goes: the source's pause, the whole dump
	// (the runtime and CRIU, as the shim waits for it), the restores.
	reportMedian(b, pauses, "ns/pause")
	reportMedian(b, dumps, "ns/dump")
	reportMedian(b, restores, "ns/restore")
}

// reportMedian reports the median of ds (none: nothing) as unit.
func reportMedian(b *testing.B, ds []time.Duration, unit string) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), unit)
}

// benchCriuByHand is the floor of CRIU itself: the dirty program, started
// on the host as PID 1 of a PID namespace of its own, dumped (left
// running) and restored n times (each restore in a new PID namespace, as
// the dump records it), with CRIU's command line. Nothing of containerd,
// the shim, the snapshotter, mounts or cgroups.
func benchCriuByHand(b *testing.B, env *daemons.Env, bin string, mb, n int) {
	criu := filepath.Join(env.BinDir, "criu")
	ready := filepath.Join(b.TempDir(), "ready")
	cmd := exec.Command(bin, strconv.Itoa(mb), ready)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setsid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("dirty program did not get ready")
		}
	}
	quiesce(b)
	var each, pauses []time.Duration
	for b.Loop() {
		img := filepath.Join(b.TempDir(), "img")
		if err := os.Mkdir(img, 0o700); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if out, err := exec.Command(criu, "dump", "-t", strconv.Itoa(cmd.Process.Pid), "-D", img, "--leave-running", "--network-lock", "skip").CombinedOutput(); err != nil {
			b.Fatalf("criu dump: %v: %s", err, lastLines(string(out), 10))
		}
		var restored []int
		for i := range n {
			pidfile := filepath.Join(img, fmt.Sprintf("pid.%d", i))
			if out, err := exec.Command(criu, "restore", "-D", img, "-d", "--pidfile", pidfile, "-o", fmt.Sprintf("restore.%d.log", i)).CombinedOutput(); err != nil {
				b.Fatalf("criu restore: %v: %s", err, lastLines(string(out), 10))
			}
			p, _ := os.ReadFile(pidfile)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(p))); err == nil {
				restored = append(restored, pid)
			}
		}
		each = append(each, time.Since(t0))
		b.StopTimer()
		if f, err := os.Open(img); err == nil {
			if st, err := stats.CriuGetDumpStats(f); err == nil {
				pauses = append(pauses, time.Duration(st.GetFrozenTime()+st.GetFreezingTime())*time.Microsecond)
			}
			f.Close()
		}
		for _, pid := range restored {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				var ws syscall.WaitStatus
				if p, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); p == pid {
					break
				}
				// Gone, or a zombie that PID 1 reaps in its own time
				// (this machine's init can take seconds).
				if _, live := procStart(pid); !live {
					break
				}
			}
		}
		_ = os.RemoveAll(img)
		b.StartTimer()
	}
	reportPerBranch(b, each, n)
	reportMedian(b, pauses, "ns/pause")
}

// BenchmarkMemoryCheckpoint: checkpoints with memory of a sandbox whose
// one process holds mb megabytes of dirty memory, beside the same
// operation without memory, in the same run: op=checkpoint (taken, then
// deleted untimed; impl=files: without --memory), op=fork-from (fork of
// one branch --from a checkpoint with memory, aborted untimed; impl=files:
// --from one without), op=rollback (of a memory branch to a checkpoint of
// it with memory: its processes killed and restored; impl=files: to a
// checkpoint without, its processes left running), op=rollback-sandbox
// (the same of the sandbox itself: its task's processes replaced).
func BenchmarkMemoryCheckpoint(b *testing.B) {
	ctx, env, _, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	data, err := os.ReadFile(buildDirty(b, b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	importDirtyImage(b, ctx, env, data)
	for _, mb := range []int{1, 100} {
		sc := dirtySandbox(b, ctx, env, fmt.Sprintf("bck%d", mb), mb)
		for _, memory := range []bool{true, false} {
			impl, opts := "files", []client.CheckpointOption(nil)
			if memory {
				impl, opts = "branch", []client.CheckpointOption{client.CheckpointWithMemory()}
			}
			name := fmt.Sprintf("mb=%d", mb)
			b.Run(name+"/op=checkpoint/impl="+impl, func(b *testing.B) {
				quiesce(b)
				for i := 0; b.Loop(); i++ {
					ck := fmt.Sprintf("c%d", i)
					if _, err := sc.Checkpoint(ctx, "", ck, opts...); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := sc.DeleteCheckpoint(ctx, ck); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
			b.Run(name+"/op=fork-from/impl="+impl, func(b *testing.B) {
				if _, err := sc.Checkpoint(ctx, "", "from", opts...); err != nil {
					b.Fatal(err)
				}
				defer func() { _ = sc.DeleteCheckpoint(ctx, "from") }()
				quiesce(b)
				for b.Loop() {
					kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1, From: "from", WithMemory: memory})
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					abortAll(b, ctx, sc, kids)
					b.StartTimer()
				}
			})
			b.Run(name+"/op=rollback/impl="+impl, func(b *testing.B) {
				kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1, WithMemory: true})
				if err != nil {
					b.Fatal(err)
				}
				defer abortAll(b, ctx, sc, kids)
				if _, err := sc.Checkpoint(ctx, kids[0].ID, "back", opts...); err != nil {
					b.Fatal(err)
				}
				quiesce(b)
				for b.Loop() {
					if err := sc.Rollback(ctx, kids[0].ID, "back"); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(name+"/op=rollback-sandbox/impl="+impl, func(b *testing.B) {
				if _, err := sc.Checkpoint(ctx, "", "root-back", opts...); err != nil {
					b.Fatal(err)
				}
				defer func() { _ = sc.DeleteCheckpoint(ctx, "root-back") }()
				quiesce(b)
				for b.Loop() {
					if err := sc.Rollback(ctx, "", "root-back"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
