package shim

import (
	"context"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// Checkpoints are the snapshotter's business: the shim only names the
// sandbox's snapshot for it, holding the sandbox's lock so that a checkpoint
// or rollback never interleaves with a fork, commit or abort from this shim.

func (c *contexts) lockedSandbox(ctx context.Context, id string) (*sandbox, context.Context, func(), error) {
	sb, err := c.sandbox(id)
	if err != nil {
		return nil, ctx, nil, err
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	// The snapshotter's business alone: done as well on a paused sandbox.
	if err := c.view(ctx, sb); err != nil {
		sb.mu.Unlock()
		return nil, ctx, nil, err
	}
	return sb, ctx, sb.mu.Unlock, nil
}

// Checkpoint records the state of a context of the sandbox.
func (c *contexts) Checkpoint(ctx context.Context, req *shimv1.CheckpointRequest) (_ *shimv1.CheckpointResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, ctx, unlock, err := c.lockedSandbox(ctx, req.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ck, err := sb.snapshot.Checkpoint(ctx, sb.ref(rootOr(req.Branch)), req.Name)
	if err != nil {
		return nil, err
	}
	return &shimv1.CheckpointResponse{Checkpoint: branch.CheckpointToProto(ck)}, nil
}

// ListCheckpoints lists the checkpoints of the sandbox's contexts.
func (c *contexts) ListCheckpoints(ctx context.Context, req *shimv1.ListCheckpointsRequest) (_ *shimv1.ListCheckpointsResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, ctx, unlock, err := c.lockedSandbox(ctx, req.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	list, err := sb.snapshot.Checkpoints(ctx, sb.root())
	if err != nil {
		return nil, err
	}
	resp := &shimv1.ListCheckpointsResponse{}
	for _, ck := range list {
		resp.Checkpoints = append(resp.Checkpoints, branch.CheckpointToProto(ck))
	}
	return resp, nil
}

// DeleteCheckpoint removes a checkpoint of the sandbox.
func (c *contexts) DeleteCheckpoint(ctx context.Context, req *shimv1.DeleteCheckpointRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, ctx, unlock, err := c.lockedSandbox(ctx, req.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := sb.snapshot.DeleteCheckpoint(ctx, sb.root(), req.Name); err != nil {
		return nil, err
	}
	return &shimv1.Empty{}, nil
}

// Rollback brings a context of the sandbox back to a checkpoint, through
// its live rootfs mount: its running processes see it at once.
func (c *contexts) Rollback(ctx context.Context, req *shimv1.RollbackRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, ctx, unlock, err := c.lockedSandbox(ctx, req.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := sb.snapshot.Rollback(ctx, sb.ref(rootOr(req.Branch)), req.Name); err != nil {
		return nil, err
	}
	return &shimv1.Empty{}, nil
}

func rootOr(id string) string {
	if id == "" {
		return branch.RootID
	}
	return id
}
