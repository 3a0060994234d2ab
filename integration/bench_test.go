//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/image-spec/identity"

	"github.com/branchbox/branchbox/integration/harness"
)

// benchShared is one private containerd for all benchmarks, started on
// first use and stopped by TestMain, so calibration rounds do not pay for
// daemon start-up.
type benchShared struct {
	once   sync.Once
	env    *harness.Env
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
func benchEnv(b *testing.B) (context.Context, *harness.Env, *containerd.Client, string) {
	b.Helper()
	requireRoot(b)
	bench.once.Do(func() {
		ctx := context.Background()
		if bench.env, bench.err = harness.Start(ctx, harness.Config{LogLevel: "info"}); bench.err != nil {
			return
		}
		archive := bench.env.Dir + "/busybox.tar"
		if bench.err = harness.WriteBusyboxImageFile(archive); bench.err != nil {
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
	img, err := bench.client.GetImage(ctx, harness.ImageRef)
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
