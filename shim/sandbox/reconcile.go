//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
)

// The shim and the snapshotter must agree on which branches are live: a
// branch the snapshotter holds but the shim lost would keep its parent
// sealed for ever, and one the snapshotter ended (a loser of a commit
// decided before a crash) must not keep running. The shim reconciles its
// branches with the snapshotter's tree on first use of a sandbox, after
// every reconnection to the snapshotter, and whenever an operation finds
// them apart.

// SettleNew reconciles a sandbox being created whose rootfs comes sealed:
// branches its snapshot holds live were left by a shim that died, and are
// aborted. It says whether the sandbox's snapshot is unsealed now. A
// failure is logged: the branch API tries again on first use.
func (c *Service) SettleNew(ctx context.Context, id string) bool {
	sb, err := c.Sandbox(id)
	if err != nil {
		return false
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := c.load(ctx, sb); err != nil || !sb.reconciled {
		log.G(ctx).WithError(err).WithField("sandbox", id).Warn("reconcile the branches of a sandbox created sealed")
		return false
	}
	infos, err := sb.snapshot.Tree(ctx, sb.root())
	if err != nil {
		return false
	}
	for _, in := range infos {
		if in.ID == branch.RootID {
			return !in.Sealed
		}
	}
	return false
}

// DropSandbox forgets a sandbox whose creation failed.
func (c *Service) DropSandbox(ctx context.Context, id string) {
	c.mu.Lock()
	sb, ok := c.sandboxes[id]
	delete(c.sandboxes, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.nodes != nil && !sb.closed {
		sb.closed = true
		close(sb.done)
		sb.snapshot.Close()
		sb.initPath.Close()
		if ms, err := c.cgroups.Mounts(); err == nil && sb.nodes[branch.RootID] != nil {
			cgroup.ReleaseFreezerKey(ms, sb.nodes[branch.RootID].cgroup)
		}
	}
}

// wake asks a settle loop to reconcile, without waiting.
func wake(kick chan struct{}) {
	select {
	case kick <- struct{}{}:
	default:
	}
}

// settle reconciles sb whenever it is woken (the snapshotter connection
// was lost, or a commit's outcome is unknown), retrying until the
// snapshotter answers, so that the losers of a commit decided before a
// crash die as soon as the snapshotter is back, with no call needed.
func (c *Service) settle(ctx context.Context, sb *Sandbox) {
	for {
		select {
		case <-sb.done:
			return
		case <-c.ctx.Done():
			return
		case <-sb.kick:
		}
		for delay := 5 * time.Millisecond; ; {
			sb.mu.Lock()
			if sb.closed {
				sb.mu.Unlock()
				return
			}
			err := c.reconcile(ctx, sb)
			paused := err != nil && c.Paused(sb)
			sb.mu.Unlock()
			if err == nil || paused {
				// A paused sandbox is reconciled once resumed: Resume
				// wakes this loop, and so does the next branch operation
				// after a thaw done behind containerd's back.
				break
			}
			log.G(ctx).WithError(err).WithField("sandbox", sb.id).Debug("reconcile branches: retrying")
			select {
			case <-sb.done:
				return
			case <-c.ctx.Done():
				return
			case <-time.After(delay):
			}
			if delay < 200*time.Millisecond {
				delay *= 2
			}
		}
	}
}

// reconcile reads the snapshotter's tree and makes sb's branches agree
// with it (under sb.mu).
func (c *Service) reconcile(ctx context.Context, sb *Sandbox) error {
	if c.Paused(sb) {
		// Its branches can neither be killed nor thawed until it is
		// resumed, which wakes the settle loop.
		return fmt.Errorf("sandbox %s: reconcile waits for its resume: %w", sb.id, PausedError(sb))
	}
	gen := sb.snapshot.Generation()
	infos, err := sb.snapshot.Tree(ctx, sb.root())
	if err != nil {
		return fmt.Errorf("sandbox %s: read the branch tree: %w", sb.id, err)
	}
	c.reconcileWith(ctx, sb, infos)
	sb.gen, sb.reconciled = gen, true
	return nil
}

// reconcileWith makes sb's branches agree with the snapshotter's tree
// infos (under sb.mu): a branch whose branch is no longer live there
// (committed, invalidated, aborted, unknown) has every process killed and
// is removed; one held for a commit that was not made is thawed; a commit
// decided but not finished (its caller went away midway) is finished,
// which unseals its parent; a branch live there that is not running here
// (its shim died, or a call failed midway) is killed through its cgroup
// and aborted. It returns the results of the commits it finished.
func (c *Service) reconcileWith(ctx context.Context, sb *Sandbox, infos []branch.Info) map[string]branch.CommitResult {
	state := make(map[string]*branch.Info, len(infos))
	for i := range infos {
		state[infos[i].ID] = &infos[i]
	}
	var gone []*Branch
	for id, n := range sb.nodes {
		if id == branch.RootID {
			continue
		}
		if in := state[id]; in != nil && in.State == branch.Live {
			if n.state.has(held) {
				c.unhold(ctx, n)
			}
			continue
		}
		gone = append(gone, n)
	}
	if len(gone) > 0 {
		for _, n := range gone {
			delete(sb.nodes, n.id)
		}
		log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "branches": ids(gone)}).Info("branches ended in the snapshotter: killing their processes")
		c.destroyAll(ctx, sb, gone, nil)
	}
	finished := map[string]branch.CommitResult{}
	for _, in := range infos {
		if in.State != branch.Committing {
			continue
		}
		res, err := sb.snapshot.Commit(ctx, sb.ref(in.ID))
		if err != nil {
			log.G(ctx).WithError(err).WithFields(log.Fields{"sandbox": sb.id, "branch": in.ID}).Warn("finish a commit decided but not finished")
			continue
		}
		log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "branch": in.ID, "invalidated": res.Invalidated}).Info("finished a commit decided but not finished")
		finished[in.ID] = res
	}
	// Branches live there and unknown here; an unknown branch below
	// another goes with the abort of the upper one.
	for _, in := range infos {
		if in.ID == branch.RootID || in.State != branch.Live || sb.nodes[in.ID] != nil {
			continue
		}
		if p := state[in.Parent]; p != nil && p.ID != branch.RootID && p.State == branch.Live && sb.nodes[p.ID] == nil {
			continue
		}
		c.abortLost(ctx, sb, state, in.ID)
	}
	for _, n := range sb.nodes {
		c.unsealIfIdle(ctx, sb, n)
	}
	return finished
}

// abortLost kills whatever runs in the cgroup that a branch not running
// here would have, removes that cgroup and the branch's bundle, and aborts
// the branch in the snapshotter.
func (c *Service) abortLost(ctx context.Context, sb *Sandbox, state map[string]*branch.Info, id string) {
	root := sb.nodes[branch.RootID]
	// Its cgroup nests in its ancestors' as start makes them.
	var chain []string
	for cur := id; cur != branch.RootID && cur != ""; {
		chain = append([]string{cur}, chain...)
		in := state[cur]
		if in == nil {
			break
		}
		cur = in.Parent
	}
	cgPath := root.cgroup
	for _, c := range chain {
		cgPath = branchCgroup(cgPath, c)
	}
	if ms, err := c.cgroups.Mounts(); err == nil {
		dirs := cgroup.DirsIn(ms, cgPath)
		if err := cgroup.KillDirs(ctx, cgPath, dirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", id).Error("kill processes of a lost branch")
		}
		if err := cgroup.RemoveDirs(dirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", id).Warn("remove cgroup of a lost branch")
		}
	}
	bundle := filepath.Join(sb.bundle, branchesDir, id)
	if err := mount.UnmountRecursive(filepath.Join(bundle, "rootfs"), unix.MNT_DETACH); err != nil {
		log.G(ctx).WithError(err).WithField("branch", id).Warn("unmount rootfs of a lost branch")
	}
	removeBundle(ctx, bundle)
	aborted, err := sb.snapshot.Abort(ctx, sb.ref(id))
	if err != nil {
		log.G(ctx).WithError(err).WithFields(log.Fields{"sandbox": sb.id, "branch": id}).Warn("abort a branch that is not running here")
		return
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "aborted": aborted}).Info("aborted branches that were not running here (lost by a crash)")
	parent := branch.RootID
	if in := state[id]; in != nil {
		parent = in.Parent
	}
	c.publish(ctx, TopicAbort, &branchEvent{Sandbox: sb.id, Parent: parent, Branches: aborted})
}
