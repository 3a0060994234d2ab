//go:build linux

package snapshotter

import (
	"context"
	"os"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"
)

func newForSuite(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
	s, err := New(ctx, root)
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

// TestSuite runs containerd's own snapshotter suite, every case. The suite
// is told it tests "overlayfs" because that name selects overlay's kernel
// semantics in its Rename case: without redirect_dir (which neither this
// snapshotter nor containerd's overlayfs enables, since layer diffs cannot
// carry redirects) renaming a lower directory fails with EXDEV and tools
// fall back to copying.
func TestSuite(t *testing.T) {
	requireRoot(t)
	testsuite.SnapshotterSuite(t, "overlayfs", newForSuite)
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts overlays and must run as root (make test does)")
	}
}
