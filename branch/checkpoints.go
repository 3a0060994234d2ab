package branch

import (
	"context"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// Checkpoint records the state of ref's rootfs as name.
func (c *Client) Checkpoint(ctx context.Context, ref Ref, name string) (Checkpoint, error) {
	resp := &branchv1.CheckpointResponse{}
	if err := c.t.invoke(ctx, "Checkpoint", &branchv1.CheckpointRequest{Context: RefToProto(ref), Name: name}, resp); err != nil {
		return Checkpoint{}, FromGRPC(err)
	}
	return CheckpointFromProto(resp.Checkpoint), nil
}

// Checkpoints lists the checkpoints of root's contexts, oldest first.
func (c *Client) Checkpoints(ctx context.Context, root Root) ([]Checkpoint, error) {
	resp := &branchv1.ListCheckpointsResponse{}
	if err := c.t.invoke(ctx, "ListCheckpoints", &branchv1.ListCheckpointsRequest{Root: RootToProto(root)}, resp); err != nil {
		return nil, FromGRPC(err)
	}
	out := make([]Checkpoint, len(resp.Checkpoints))
	for i, ck := range resp.Checkpoints {
		out[i] = CheckpointFromProto(ck)
	}
	return out, nil
}

// DeleteCheckpoint removes checkpoint name of root; refused (errdefs
// FailedPrecondition) while a live branch is forked from it. Checkpoints
// built on it keep its layer; they list their parent as "(deleted)".
func (c *Client) DeleteCheckpoint(ctx context.Context, root Root, name string) error {
	if err := c.t.invoke(ctx, "DeleteCheckpoint", &branchv1.DeleteCheckpointRequest{Root: RootToProto(root), Name: name}, &branchv1.DeleteCheckpointResponse{}); err != nil {
		return FromGRPC(err)
	}
	return nil
}

// Rollback brings ref's rootfs back to its checkpoint name, visible at once
// to its running processes; refused while ref has live children.
func (c *Client) Rollback(ctx context.Context, ref Ref, name string) error {
	if err := c.t.invoke(ctx, "Rollback", &branchv1.RollbackRequest{Context: RefToProto(ref), Name: name}, &branchv1.RollbackResponse{}); err != nil {
		return FromGRPC(err)
	}
	return nil
}

// Checkpoint records the state of a context of the sandbox ("" for the
// sandbox itself, or a branch id) as name.
func (s *SandboxClient) Checkpoint(ctx context.Context, branch, name string) (Checkpoint, error) {
	resp, err := s.api.Checkpoint(s.ctx(ctx), &shimv1.CheckpointRequest{Sandbox: s.ID, Branch: branch, Name: name})
	if err != nil {
		return Checkpoint{}, fromTTRPC(err)
	}
	return CheckpointFromShim(resp.Checkpoint), nil
}

// Checkpoints lists the checkpoints of the sandbox's contexts.
func (s *SandboxClient) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	resp, err := s.api.ListCheckpoints(s.ctx(ctx), &shimv1.ListCheckpointsRequest{Sandbox: s.ID})
	if err != nil {
		return nil, fromTTRPC(err)
	}
	out := make([]Checkpoint, len(resp.Checkpoints))
	for i, ck := range resp.Checkpoints {
		out[i] = CheckpointFromShim(ck)
	}
	return out, nil
}

// DeleteCheckpoint removes a checkpoint of the sandbox.
func (s *SandboxClient) DeleteCheckpoint(ctx context.Context, name string) error {
	_, err := s.api.DeleteCheckpoint(s.ctx(ctx), &shimv1.DeleteCheckpointRequest{Sandbox: s.ID, Name: name})
	return fromTTRPC(err)
}

// Rollback brings a context of the sandbox back to its checkpoint name,
// visible at once to its running processes.
func (s *SandboxClient) Rollback(ctx context.Context, branch, name string) error {
	_, err := s.api.Rollback(s.ctx(ctx), &shimv1.RollbackRequest{Sandbox: s.ID, Branch: branch, Name: name})
	return fromTTRPC(err)
}
