//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// Commit freezes the winner, lets the snapshotter apply its changes through
// the parent's live mount (first commit wins), then kills the winner and
// every invalidated branch. The winner is frozen rather than killed before
// the snapshotter decides, so that a commit the snapshotter refuses, or
// never got, leaves it running as it was; one whose outcome is unknown
// (the connection was lost mid-call) stays frozen until the snapshotter
// answers again, and is then killed or thawed as its tree says.
func (c *Service) Commit(ctx context.Context, req *shimv1.CommitRequest) (_ *shimv1.CommitResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if req.Branch == "" || req.Branch == branch.RootID {
		return nil, fmt.Errorf("name a branch of sandbox %s (SANDBOX/BRANCH), not the sandbox itself: %w", req.Sandbox, errdefs.ErrInvalidArgument)
	}
	sb, err := c.Sandbox(req.Sandbox)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	defer sb.active()()
	if err := c.load(ctx, sb); err != nil {
		return nil, err
	}
	n, ok := sb.nodes[req.Branch]
	if !ok {
		// A retry of a commit whose reply was lost, or one the snapshotter
		// finished after a crash: the tree says what became of it.
		return c.commitOutcome(ctx, sb, req.Branch, nil)
	}
	if kids := sb.descendants(n.id); len(kids) > 0 {
		return nil, fmt.Errorf("commit %s/%s: it has live branches (%s); commit or abort them first: %w", sb.id, n.id, ids(kids), errdefs.ErrFailedPrecondition)
	}
	if !n.state.has(held) {
		if err := c.hold(ctx, n); err != nil {
			return nil, fmt.Errorf("commit %s/%s: freeze its processes: %w", sb.id, n.id, err)
		}
	}
	if err := ctx.Err(); err != nil {
		// Not sent: the caller gave up while its branch was frozen.
		c.unhold(ctx, n)
		return nil, fmt.Errorf("commit %s/%s: not made, the caller gave up; the branch runs on: %w", sb.id, n.id, err)
	}
	res, err := sb.snapshot.Commit(ctx, sb.ref(n.id))
	if sb.releasing.retryForRoom(ctx, err) {
		res, err = sb.snapshot.Commit(ctx, sb.ref(n.id))
	}
	if err != nil {
		if errors.Is(err, branchapi.ErrNotSent) {
			// The snapshotter never saw it: the branch runs on.
			c.unhold(ctx, n)
			return nil, fmt.Errorf("commit %s/%s: not made, the branch runs on: %w", sb.id, n.id, err)
		}
		return c.commitOutcome(ctx, sb, n.id, err)
	}
	return c.committed(ctx, sb, n.id, n.parent, res.Invalidated, res.Parent), nil
}

// committed ends a decided commit in the shim: the winner and every
// invalidated branch still running are killed and removed, the parent is
// unsealed if it has no branch left, and the commit is published.
func (c *Service) committed(ctx context.Context, sb *Sandbox, winner, parentID string, invalidated []string, parent branch.Info) *shimv1.CommitResponse {
	var gone []*Branch
	for _, id := range append([]string{winner}, invalidated...) {
		if o, ok := sb.nodes[id]; ok {
			gone = append(gone, o)
			delete(sb.nodes, id)
		}
	}
	c.destroyAll(ctx, sb, gone, nil)
	if p, ok := sb.nodes[parentID]; ok {
		c.unsealIfIdle(ctx, sb, p)
	}
	c.publish(ctx, TopicCommit, &branchEvent{Sandbox: sb.id, Parent: parentID, Branches: []string{winner}, Winner: winner, Epoch: parent.Epoch})
	if len(invalidated) > 0 {
		c.publish(ctx, TopicInvalidate, &branchEvent{Sandbox: sb.id, Parent: parentID, Branches: invalidated, Winner: winner, Epoch: parent.Epoch})
	}
	resp := &shimv1.CommitResponse{Invalidated: invalidated}
	if p, ok := sb.nodes[parentID]; ok {
		resp.Parent = c.describe(sb, p, &parent, true)
	}
	return resp
}

// commitOutcome settles a commit of id from the snapshotter's tree, after
// the commit call failed with callErr (its fate unknown), or for a branch
// this shim no longer runs (callErr nil): a commit that was made returns
// its result, one decided but not finished is finished, and one that was
// not made returns why. Every branch is reconciled with the tree on the
// way, so the losers of a decided commit die here. If the snapshotter
// cannot say, a held winner stays frozen and the settle loop takes over.
func (c *Service) commitOutcome(ctx context.Context, sb *Sandbox, id string, callErr error) (*shimv1.CommitResponse, error) {
	infos, err := sb.snapshot.Tree(ctx, sb.root())
	if err != nil {
		if callErr == nil {
			return nil, fmt.Errorf("commit %s/%s: %w", sb.id, id, err)
		}
		wake(sb.kick)
		return nil, fmt.Errorf("commit %s/%s: outcome unknown (%v); the branch stays frozen until the snapshotter answers, then is killed if the commit was made or thawed if not; call commit again to learn which: %w", sb.id, id, callErr, errdefs.ErrUnavailable)
	}
	finished := c.reconcileWith(ctx, sb, infos)
	if res, ok := finished[id]; ok {
		return c.committed(ctx, sb, id, res.Parent.ID, res.Invalidated, res.Parent), nil
	}
	var info *branch.Info
	for i := range infos {
		if infos[i].ID == id {
			info = &infos[i]
		}
	}
	switch {
	case info != nil && info.State == branch.Committed:
		var invalidated []string
		for _, o := range infos {
			if o.State == branch.Stale && o.Winner == id && o.WinnerEpoch == info.WinnerEpoch {
				invalidated = append(invalidated, o.ID)
			}
		}
		var parent branch.Info
		for _, o := range infos {
			if o.ID == info.Parent {
				parent = o
			}
		}
		return c.committed(ctx, sb, id, info.Parent, invalidated, parent), nil
	case info != nil && info.State == branch.Committing:
		// Decided; reconciling failed to finish it (logged).
		return nil, fmt.Errorf("commit %s/%s: decided, not yet finished (its processes are dead); call commit again to finish it: %w", sb.id, id, errdefs.ErrUnavailable)
	case callErr != nil:
		return nil, fmt.Errorf("commit %s/%s: %w", sb.id, id, callErr)
	case info != nil && info.State == branch.Live:
		return nil, fmt.Errorf("branch %s of %s was not running here (lost by a crash) and was aborted: %w", id, sb.id, errdefs.ErrNotFound)
	}
	// Let the snapshotter say what became of it (stale, aborted...).
	if _, err := sb.snapshot.Mounts(ctx, sb.ref(id)); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("branch %s of %s is not running: %w", id, sb.id, errdefs.ErrNotFound)
}

// hold freezes every process of a branch for its commit: the snapshotter
// must read a layer nobody writes to, and the branch must be able to run
// on if the commit is not made.
func (c *Service) hold(ctx context.Context, n *Branch) error {
	if n.procs() == nil {
		n.state.set(held)
		return nil
	}
	ms, err := c.cgroups.Mounts()
	if err != nil {
		return err
	}
	// A branch whose only process is its waiting init (the branch init,
	// which never writes to the rootfs) need not be waited for: anything
	// it starts from now on is born frozen. That wait is a scheduling
	// delay, milliseconds on a busy machine.
	alone := 0
	if n.init != nil && !n.hasCommand {
		alone = n.init.Pid()
	}
	if err := cgroup.FreezeAll(cgroup.DirsIn(ms, n.cgroup), alone); err != nil {
		_ = cgroup.ThawAll(cgroup.DirsIn(ms, n.cgroup))
		return err
	}
	n.state.set(held)
	return nil
}

// unhold thaws a branch held for a commit that was not made.
func (c *Service) unhold(ctx context.Context, n *Branch) {
	n.state.clear(held)
	ms, err := c.cgroups.Mounts()
	if err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Error("thaw branch after a commit not made")
		return
	}
	if err := cgroup.ThawAll(cgroup.DirsIn(ms, n.cgroup)); err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Error("thaw branch after a commit not made")
	}
}
