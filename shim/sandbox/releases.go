//go:build linux

package sandbox

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/containerd/errdefs"
)

// releases counts the releases of ended branches still going on (their
// cgroups, runtime state and rootfs: destroyAll); Teardown waits for them.
// Until its release ends, an ended branch's overlay holds the blocks and
// inodes of its discarded layer (holdRootfs).
type releases struct {
	wg sync.WaitGroup
	n  atomic.Int32
}

func (r *releases) Add(n int) {
	r.n.Add(int32(n))
	r.wg.Add(n)
}

func (r *releases) Done() {
	r.n.Add(-1)
	r.wg.Done()
}

func (r *releases) Wait() { r.wg.Wait() }

// retryForRoom says whether an operation the snapshotter refused with err
// is worth trying again: it was refused for room (resource exhausted)
// while releases were going on, which it waited for (within ctx). "Abort
// the branch that filled the disk, then commit the other" must not be
// refused for the aborted layer the release has not let go of yet.
func (r *releases) retryForRoom(ctx context.Context, err error) bool {
	if !errdefs.IsResourceExhausted(err) || r.n.Load() == 0 {
		return false
	}
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
