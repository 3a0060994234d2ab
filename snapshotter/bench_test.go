//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
)

// BenchmarkInProcessPrepareMounts measures Prepare+Mounts in process, without
// containerd or gRPC, against containerd's overlayfs snapshotter on the same
// filesystem: the cost of the snapshotter itself. Removal is untimed.
func BenchmarkInProcessPrepareMounts(b *testing.B) {
	requireRoot(b)
	ctx := context.Background()
	for _, impl := range []string{"branch", "overlayfs"} {
		b.Run("impl="+impl, func(b *testing.B) {
			root := b.TempDir()
			var (
				sn  snapshots.Snapshotter
				err error
			)
			if impl == "branch" {
				sn, err = New(ctx, root)
			} else {
				sn, err = overlay.NewSnapshotter(root)
			}
			if err != nil {
				b.Fatal(err)
			}
			defer sn.Close()
			parent := baseLayer(b, ctx, sn)
			i := 0
			for b.Loop() {
				key := fmt.Sprintf("bench-%d", i)
				i++
				if _, err := sn.Prepare(ctx, key, parent); err != nil {
					b.Fatal(err)
				}
				if _, err := sn.Mounts(ctx, key); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := sn.Remove(ctx, key); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// baseLayer commits a small base layer and returns its name.
func baseLayer(b *testing.B, ctx context.Context, sn snapshots.Snapshotter) string {
	b.Helper()
	m, err := sn.Prepare(ctx, "base-active", "")
	if err != nil {
		b.Fatal(err)
	}
	// A base snapshot is a bind of its own directory: write straight into it.
	for i := range 100 {
		if err := os.WriteFile(filepath.Join(m[0].Source, fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := sn.Commit(ctx, "base", "base-active"); err != nil {
		b.Fatal(err)
	}
	return "base"
}
