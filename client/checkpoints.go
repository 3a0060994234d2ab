package client

import (
	"context"
	"fmt"
	"time"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// CheckpointOption changes what Checkpoint records.
type CheckpointOption func(*shimv1.CheckpointRequest)

// CheckpointWithMemory records the branch's running processes too (CRIU;
// docs/memory-fork.md): ForkOptions{From: name, WithMemory: true} then
// restores them into each branch, and Rollback of a memory branch to it
// restores them there.
func CheckpointWithMemory() CheckpointOption {
	return func(r *shimv1.CheckpointRequest) { r.Memory = true }
}

// Checkpoint records the state of a branch of the sandbox ("" for the
// sandbox itself, or a branch id) as name. If ctx ends first, Checkpoint
// returns at once with ctx's error and no checkpoint is kept: the shim
// deletes one it made after the caller's deadline, and the client one
// whose answer came after ctx ended.
func (s *SandboxClient) Checkpoint(ctx context.Context, branchID, name string, opts ...CheckpointOption) (branch.Checkpoint, error) {
	req := &shimv1.CheckpointRequest{Sandbox: s.ID, Branch: branchID, Name: name}
	for _, o := range opts {
		o(req)
	}
	what := fmt.Sprintf("checkpoint %q of %s", name, s.ID)
	resp, err := detached(ctx, &s.undoing, what, checkpointBound, func(ctx context.Context) (*shimv1.CheckpointResponse, error) {
		resp, err := s.api.Checkpoint(s.ctx(ctx), req)
		return resp, s.shimErr(err)
	}, deleteOrphan(what, name, s.DeleteCheckpoint))
	if err != nil {
		return branch.Checkpoint{}, err
	}
	return branch.CheckpointFromProto(resp.Checkpoint), nil
}

// checkpointBound bounds a checkpoint (detached): its layer's copy and a
// memory image's dump and copy take as long as their sizes.
const checkpointBound = 30 * time.Minute

// Checkpoints lists the checkpoints of the sandbox's branches.
func (s *SandboxClient) Checkpoints(ctx context.Context) ([]branch.Checkpoint, error) {
	resp, err := s.api.ListCheckpoints(s.ctx(ctx), &shimv1.ListCheckpointsRequest{Sandbox: s.ID})
	if err != nil {
		return nil, s.shimErr(err)
	}
	out := make([]branch.Checkpoint, len(resp.Checkpoints))
	for i, ck := range resp.Checkpoints {
		out[i] = branch.CheckpointFromProto(ck)
	}
	return out, nil
}

// DeleteCheckpoint removes a checkpoint of the sandbox.
func (s *SandboxClient) DeleteCheckpoint(ctx context.Context, name string) error {
	_, err := s.api.DeleteCheckpoint(s.ctx(ctx), &shimv1.DeleteCheckpointRequest{Sandbox: s.ID, Name: name})
	return s.shimErr(err)
}

// Rollback brings a branch of the sandbox back to its checkpoint name,
// visible at once to its running processes.
func (s *SandboxClient) Rollback(ctx context.Context, branchID, name string) error {
	_, err := s.api.Rollback(s.ctx(ctx), &shimv1.RollbackRequest{Sandbox: s.ID, Branch: branchID, Name: name})
	return s.shimErr(err)
}
