//go:build linux

package sandbox

import (
	"context"
	"time"

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
//
// The init's exit is published once this returns, and a Wait for it
// returns once the branches are gone, so it is bounded: an operation that
// holds the sandbox may be waiting for a snapshotter that does not answer
// (hung on its disk, stopped), and the exit of every container of the
// shim would wait with it. The processes under the sandbox's cgroup are
// then killed without the sandbox's lock, and what is left of ending its
// branches (their snapshots, mounts, cgroups) goes on once the lock is
// free, after endGrace in the background.
func (c *Service) SandboxExited(ctx context.Context, id string) {
	sb, err := c.Sandbox(id)
	if err != nil {
		return
	}
	ended := make(chan struct{})
	locked := sb.mu.TryLock()
	if !locked {
		c.killTree(ctx, sb)
	}
	go func() {
		defer close(ended)
		if !locked {
			sb.mu.Lock()
		}
		defer sb.mu.Unlock()
		c.exitedLocked(context.WithoutCancel(ctx), sb)
	}()
	t := time.NewTimer(endGrace)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
		if locked {
			// endAll killed the processes; the snapshotter's part waits.
			log.G(ctx).WithField("sandbox", id).Warn("the sandbox's init exited; its branches' processes are killed, and their end in the snapshotter, which does not answer, goes on in the background")
		} else {
			log.G(ctx).WithField("sandbox", id).Warn("the sandbox's init exited; its processes are killed, and the end of its branches waits for an operation on them, which waits for the snapshotter")
		}
		sb.markStopped()
	}
}

// endGrace bounds how long the end of a sandbox's init waits for its
// branches to be ended in full, and how long that end waits for the
// snapshotter's abort of them: a snapshotter that does not answer by then
// has them aborted when it is asked for their root again (a new task of
// the container, its removal).
const endGrace = 10 * time.Second

// killTree kills every process under the sandbox's cgroup, its branches'
// and the inits started ahead included, without the sandbox's lock. Each
// is sent SIGKILL before any frozen cgroup thaws, so that a branch frozen
// for its commit dies as it thaws without running again.
func (c *Service) killTree(ctx context.Context, sb *Sandbox) {
	if sb.cgroup == "" {
		return
	}
	ms, err := c.cgroups.Mounts()
	if err != nil {
		log.G(ctx).WithError(err).Error("list cgroup hierarchies")
		return
	}
	dirs := cgroup.DirsIn(ms, sb.cgroup)
	if len(dirs) == 0 {
		return
	}
	if err := cgroup.SignalAll(ctx, dirs); err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", sb.id).Warn("kill the processes of an ended sandbox at once")
	}
	if err := cgroup.KillDirs(ctx, sb.cgroup, dirs); err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", sb.id).Error("kill the processes of an ended sandbox")
	}
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
	// Every branch is killed at once, their snapshots aborted while they
	// die, for at most endGrace (SandboxExited).
	all := sb.descendants(branch.RootID)
	for _, d := range all {
		delete(sb.nodes, d.id)
	}
	wait := c.destroyAll(ctx, sb, all, func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endGrace)
		defer cancel()
		for _, d := range all {
			if d.parent != branch.RootID {
				continue
			}
			if _, err := sb.snapshot.Abort(actx, sb.ref(d.id)); err != nil {
				log.G(ctx).WithError(err).WithField("branch", d.id).Warn("abort branch of ended sandbox")
			}
		}
	})
	wait()
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
