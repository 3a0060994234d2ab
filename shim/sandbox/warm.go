//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"strconv"

	"github.com/containerd/log"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// warm starts the sandbox's pool of inits at its first contact through the
// branch API (a client's dial describes the sandbox before its first
// fork), so that the first fork, too, takes an init waiting in its cgroup
// with the early part of its root made, instead of spawning one on its
// path and waiting for its cgroup moves (19-31 ms here against 3-6 for
// the forks after it: docs/benchmarks.md). The pool is the one a first
// fork of one branch with the defaults would have made after it; a fork
// that asks for other namespaces starts its own, as before. The branch
// id the snapshotter gives first is 1 for a sandbox no branch of which
// is known; a tree with a history (the task started again) makes the
// guess wrong, and the first fork drops that init. It runs on its own
// goroutine, after the call that made the contact: that call does not
// wait for it. It runs once a sandbox. The caller holds sb.mu.
func (c *Service) warm(ctx context.Context, sb *Sandbox) {
	if sb.warming.Swap(true) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if err := c.startPool(ctx, sb); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", sb.id).Debug("no inits started ahead of the first fork")
		}
	}()
}

// warmSoon has a sandbox a client just dialled (Describe) loaded and its
// pool started, in the background: the client's next call is likely its
// first fork. Once warm has run, every later dial costs nothing here.
func (c *Service) warmSoon(ctx context.Context, sb *Sandbox) {
	if sb.warming.Load() {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		_ = c.view(ctx, sb) // calls warm; a failure is the next call's to report
	}()
}

// startPool makes the pool warm starts, under sb.mu.
func (c *Service) startPool(ctx context.Context, sb *Sandbox) error {
	root := sb.nodes[branch.RootID]
	if sb.pool != nil || sb.stopped || sb.closed || root == nil || c.Paused(sb) ||
		c.inits.Binary == "" || (sb.opts != nil && sb.opts.NoPivotRoot) {
		return nil
	}
	if sb.nextID == 0 && len(sb.nodes) == 1 {
		sb.nextID = 1
	}
	if sb.nextID == 0 {
		return fmt.Errorf("the id of the next branch is not known")
	}
	pid, err := c.initPid(ctx, sb, root)
	if err != nil {
		return err
	}
	req := &shimv1.ForkRequest{Count: 1}
	if err := checkFork(req); err != nil {
		return err
	}
	spec, err := branchSpec(root.spec, branchCgroup(root.cgroup, strconv.FormatUint(sb.nextID, 10)), joinOf(pid, req.Net), req)
	if err != nil {
		return err
	}
	if !c.useInit(ctx, sb, spec) {
		return fmt.Errorf("its branches start on the runtime")
	}
	sb.pool = newPool(ctx, c.inits, root, spec)
	sb.pool.Fill(ctx, 1, sb.nextNames(root.cgroup))
	return nil
}
