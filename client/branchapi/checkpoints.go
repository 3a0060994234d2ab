package branchapi

import (
	"context"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	"github.com/branchbox/branchbox/branch"
)

// Checkpoint records the state of ref's rootfs as name.
func (c *Client) Checkpoint(ctx context.Context, ref branch.Ref, name string, opts ...branch.CheckpointOpt) (branch.Checkpoint, error) {
	var o branch.CheckpointOptions
	for _, opt := range opts {
		opt(&o)
	}
	resp := &branchv1.CheckpointResponse{}
	if err := c.t.invoke(ctx, "Checkpoint", &branchv1.CheckpointRequest{Branch: branch.RefToProto(ref), Name: name, MemoryDir: o.MemoryDir,
		MaxCheckpoints: uint32(o.MaxCheckpoints), MaxBytes: o.MaxBytes}, resp); err != nil {
		return branch.Checkpoint{}, branch.FromGRPC(err)
	}
	return branch.CheckpointFromProto(resp.Checkpoint), nil
}

// Checkpoints lists the checkpoints of root's branches, oldest first.
func (c *Client) Checkpoints(ctx context.Context, root branch.Root) ([]branch.Checkpoint, error) {
	resp := &branchv1.ListCheckpointsResponse{}
	if err := c.t.invoke(ctx, "ListCheckpoints", &branchv1.ListCheckpointsRequest{Root: branch.RootToProto(root)}, resp); err != nil {
		return nil, branch.FromGRPC(err)
	}
	out := make([]branch.Checkpoint, len(resp.Checkpoints))
	for i, ck := range resp.Checkpoints {
		out[i] = branch.CheckpointFromProto(ck)
	}
	return out, nil
}

// DeleteCheckpoint removes checkpoint name of root; refused (errdefs
// FailedPrecondition) while a live branch is forked from it. Checkpoints
// built on it keep its layer; they list their parent as "(deleted)".
func (c *Client) DeleteCheckpoint(ctx context.Context, root branch.Root, name string) error {
	if err := c.t.invoke(ctx, "DeleteCheckpoint", &branchv1.DeleteCheckpointRequest{Root: branch.RootToProto(root), Name: name}, &branchv1.DeleteCheckpointResponse{}); err != nil {
		return branch.FromGRPC(err)
	}
	return nil
}

// Rollback brings ref's rootfs back to its checkpoint name, visible at once
// to its running processes; refused while ref has live children.
func (c *Client) Rollback(ctx context.Context, ref branch.Ref, name string, opts ...branch.RollbackOpt) error {
	var o branch.RollbackOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := c.t.invoke(ctx, "Rollback", &branchv1.RollbackRequest{Branch: branch.RefToProto(ref), Name: name, Processes: o.Processes}, &branchv1.RollbackResponse{}); err != nil {
		return branch.FromGRPC(err)
	}
	return nil
}
