//go:build linux

package sandbox

import (
	"context"
	"fmt"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// Abort kills and discards a branch and its descendants.
func (c *Service) Abort(ctx context.Context, req *shimv1.AbortRequest) (_ *shimv1.AbortResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, n, err := c.branchFor(ctx, req.Sandbox, req.Branch, true, true)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	defer sb.mu.Unlock()
	defer sb.active()()
	gone := append(sb.descendants(n.id), n)
	for _, d := range gone {
		delete(sb.nodes, d.id)
	}
	// The snapshotter discards the layers while the processes die: once
	// sent SIGKILL they run none of their own code (one forked while
	// cgroup v1 kills them one by one dies with the PID namespace
	// meanwhile), and the reply still waits for both.
	var aborted []string
	c.destroyAll(ctx, sb, gone, func() { aborted, err = sb.snapshot.Abort(ctx, sb.ref(n.id)) })
	if err != nil {
		// Its processes are dead and it is forgotten here; the snapshotter
		// may still hold it, and the next reconciliation aborts it there.
		wake(sb.kick)
		return nil, fmt.Errorf("abort %s/%s (its processes were killed; the snapshotter discards it once it answers): %w", sb.id, n.id, err)
	}
	if p, ok := sb.nodes[n.parent]; ok {
		c.unsealIfIdle(ctx, sb, p)
	}
	c.publish(ctx, TopicAbort, &branchEvent{Sandbox: sb.id, Parent: n.parent, Branches: aborted})
	return &shimv1.AbortResponse{Aborted: aborted}, nil
}
