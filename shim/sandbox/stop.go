//go:build linux

package sandbox

import (
	"context"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/containerd/log"
)

// Teardown removes every branch of a sandbox whose task is being
// deleted, and unseals its rootfs, so that nothing outlives it.
func (c *Service) Teardown(ctx context.Context, id string) {
	defer c.CloseSelfAll(id)
	c.mu.Lock()
	sb, ok := c.sandboxes[id]
	delete(c.sandboxes, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	c.endAll(ctx, sb)
	if sb.snapshot != nil {
		sb.snapshot.Close()
	}
}

// SandboxExited kills and discards every branch of a sandbox whose init
// exited, as runc-v2 kills every process of a container whose init
// exited: the branches live in their own PID namespaces, which the init's
// end does not reach. Branch operations on it fail from then on, until
// its task is deleted and a new one created.
func (c *Service) SandboxExited(ctx context.Context, id string) {
	sb, err := c.Sandbox(id)
	if err != nil {
		return
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	c.exitedLocked(ctx, sb)
}

// exitedLocked is SandboxExited with sb.mu held.
func (c *Service) exitedLocked(ctx context.Context, sb *Sandbox) {
	defer sb.markStopped()
	sb.stopped = true
	c.endAll(withNS(ctx, sb), sb)
}

// markStopped says that nothing of the sandbox's branches runs any more.
func (sb *Sandbox) markStopped() {
	sb.stopOnce.Do(func() { close(sb.stoppedCh) })
}

// WaitStopped waits until the branches of a sandbox whose init exited are
// gone, so that a Wait for its init returns only once nothing of it runs.
func (c *Service) WaitStopped(ctx context.Context, id string) error {
	sb, err := c.Sandbox(id)
	if err != nil {
		return nil // deleted: Teardown took its branches
	}
	select {
	case <-sb.stoppedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endAll kills and discards every branch of a sandbox, with the guarantees
// of an abort, and unseals its rootfs; sb.mu is held. It runs once.
func (c *Service) endAll(ctx context.Context, sb *Sandbox) {
	if sb.nodes == nil || sb.closed {
		return
	}
	sb.closed = true
	close(sb.done)
	if sb.pool != nil {
		sb.pool.Close(ctx)
		sb.pool = nil
	}
	defer sb.initPath.Close()
	for _, d := range sb.descendants(branch.RootID) {
		c.destroy(ctx, sb, d)
		delete(sb.nodes, d.id)
		if d.parent == branch.RootID {
			if _, err := sb.snapshot.Abort(ctx, sb.ref(d.id)); err != nil {
				log.G(ctx).WithError(err).WithField("branch", d.id).Warn("abort branch of ended sandbox")
			}
		}
	}
	if root := sb.nodes[branch.RootID]; root != nil && root.state.has(sealFrozen) {
		_ = cgroup.ThawOwn(ctx, root.cgroup)
		root.state.clear(sealFrozen)
	}
	// The sandbox's cgroup goes after this: its branches' must be gone.
	sb.releasing.Wait()
	if ms, err := c.cgroups.Mounts(); err == nil && sb.nodes[branch.RootID] != nil {
		cgroup.ReleaseFreezerKey(ms, sb.nodes[branch.RootID].cgroup)
	}
}
