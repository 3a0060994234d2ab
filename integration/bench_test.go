//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// benchShared is one private containerd for all benchmarks, started on
// first use and stopped by TestMain, so calibration rounds do not pay for
// daemon start-up.
type benchShared struct {
	once   sync.Once
	env    *daemons.Env
	client *containerd.Client
	err    error
	// Fixtures of the checkpoint benchmarks, and what undoes them.
	diff     map[string]*diffFixture
	cleanups []func()
}

var bench benchShared

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(bench.cleanups) - 1; i >= 0; i-- {
		bench.cleanups[i]()
	}
	if bench.client != nil {
		bench.client.Close()
	}
	if bench.env != nil {
		if err := bench.env.Stop(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "stop benchmark env:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// benchEnv returns the shared env, its client, a namespaced context, and the
// chain ID of the test image, unpacked into both overlayfs and branch.
func benchEnv(b *testing.B) (context.Context, *daemons.Env, *containerd.Client, string) {
	b.Helper()
	requireRoot(b)
	bench.once.Do(func() {
		ctx := context.Background()
		// BENCH_SNAPSHOTTER_FLAGS: the snapshotter's flags, to compare its
		// settings in one build (--seal-mounts-after=0, say).
		cfg := daemons.Config{LogLevel: "info", SnapshotterFlags: strings.Fields(os.Getenv("BENCH_SNAPSHOTTER_FLAGS"))}
		if bench.env, bench.err = daemons.Start(ctx, cfg); bench.err != nil {
			return
		}
		archive := bench.env.Dir + "/busybox.tar"
		if bench.err = ociimage.WriteBusyboxImageFile(archive); bench.err != nil {
			return
		}
		for _, sn := range []string{"overlayfs", "branch"} {
			if _, bench.err = bench.env.Ctr(ctx, "images", "import", "--snapshotter", sn, archive); bench.err != nil {
				return
			}
		}
		bench.client, bench.err = containerd.New(bench.env.Address)
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	ctx := namespaces.WithNamespace(context.Background(), bench.env.Namespace)
	img, err := bench.client.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		b.Fatal(err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return ctx, bench.env, bench.client, identity.ChainID(diffIDs).String()
}

// BenchmarkContainerdPrepareMounts measures Prepare+Mounts of a container rootfs on
// the image through containerd, for the branch snapshotter and containerd's
// built-in overlayfs, on one daemon in one run. Removal is outside the timer.
func BenchmarkContainerdPrepareMounts(b *testing.B) {
	ctx, _, client, chainID := benchEnv(b)
	// A lease keeps containerd's garbage collector off the snapshots.
	ctx, done, err := client.WithLease(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer done(context.Background())
	for _, sn := range []string{"branch", "overlayfs"} {
		b.Run("impl="+sn, func(b *testing.B) {
			svc := client.SnapshotService(sn)
			i := 0
			quiesce(b)
			for b.Loop() {
				key := fmt.Sprintf("bench-%s-%d", sn, i)
				i++
				if _, err := svc.Prepare(ctx, key, chainID); err != nil {
					b.Fatal(err)
				}
				if _, err := svc.Mounts(ctx, key); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := svc.Remove(ctx, key); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// quiesce waits, before a measurement, until the machine is close to idle:
// dirty pages written out, then a 200 ms stretch with the CPUs at least
// 90% idle and not waiting for I/O (15 s at most). What an earlier
// benchmark left running (the garbage collection of its copies, their
// writeback, a sandbox's set-up) would otherwise fall on whichever side of
// the next comparison runs first.
func quiesce(b *testing.B) {
	b.Helper()
	unix.Sync()
	prevBusy, prevTotal := cpuTimes(b)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		busy, total := cpuTimes(b)
		if total > prevTotal && float64(busy-prevBusy)/float64(total-prevTotal) < 0.1 {
			return
		}
		prevBusy, prevTotal = busy, total
	}
	b.Log("quiesce: the machine did not go idle within 15 s; measuring anyway")
}

// cpuTimes reads the CPUs' time from /proc/stat: busy (all but idle; I/O
// wait counts as busy) and total, in clock ticks.
func cpuTimes(b *testing.B) (busy, total uint64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		b.Fatalf("/proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:min(len(fields), 9)] { // guest time is in user already
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q: %v", line, err)
		}
		total += v
		if i != 3 { // idle
			busy += v
		}
	}
	return busy, total
}
