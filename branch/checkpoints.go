package branch

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

// Checkpoint is an immutable, named state of a context's rootfs.
type Checkpoint struct {
	Name string `json:"name"`
	// Context is the id of the context it is a state of ("0": the root).
	Context string `json:"context"`
	// Parent is the checkpoint whose state this one's layer holds the
	// changes since ("" for a full one, "(deleted)" once that was deleted).
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	// Size and Entries are what its own layer holds.
	Size    int64 `json:"size"`
	Entries int64 `json:"entries"`
	Depth   int   `json:"depth"`
	// Head: the context's next checkpoint builds on this one.
	Head bool `json:"head"`
	// Children are the checkpoints built on it; Branches the live branches
	// forked from it, which keep it from being deleted.
	Children []string `json:"children,omitempty"`
	Branches []string `json:"branches,omitempty"`
}

// Age is how long ago the checkpoint was taken.
func (c Checkpoint) Age(now time.Time) time.Duration { return now.Sub(c.Created) }

func checkpointFromProto(c *branchv1.Checkpoint) Checkpoint {
	if c == nil {
		return Checkpoint{}
	}
	out := Checkpoint{Name: c.Name, Context: c.Context, Parent: c.Parent, Size: c.Size, Entries: c.Entries,
		Depth: int(c.Depth), Head: c.Head, Children: c.Children, Branches: c.Branches}
	if c.Created != nil {
		out.Created = c.Created.AsTime()
	}
	return out
}

func checkpointFromShim(c *shimv1.Checkpoint) Checkpoint {
	if c == nil {
		return Checkpoint{}
	}
	out := Checkpoint{Name: c.Name, Context: c.Context, Parent: c.Parent, Size: c.Size, Entries: c.Entries,
		Depth: int(c.Depth), Head: c.Head, Children: c.Children, Branches: c.Branches}
	if c.Created != nil {
		out.Created = c.Created.AsTime()
	}
	return out
}

// CheckpointToShim converts a checkpoint for the shim's API.
func CheckpointToShim(c Checkpoint) *shimv1.Checkpoint {
	out := &shimv1.Checkpoint{Name: c.Name, Context: c.Context, Parent: c.Parent, Size: c.Size, Entries: c.Entries,
		Depth: uint32(c.Depth), Head: c.Head, Children: c.Children, Branches: c.Branches}
	if !c.Created.IsZero() {
		out.Created = timestamppb.New(c.Created)
	}
	return out
}

// Checkpoint records the state of ref's rootfs as name.
func (c *Client) Checkpoint(ctx context.Context, ref Ref, name string) (Checkpoint, error) {
	resp := &branchv1.CheckpointResponse{}
	if err := c.t.invoke(ctx, "Checkpoint", &branchv1.CheckpointRequest{Context: refToProto(ref), Name: name}, resp); err != nil {
		return Checkpoint{}, fromGRPC(err)
	}
	return checkpointFromProto(resp.Checkpoint), nil
}

// Checkpoints lists the checkpoints of root's contexts, oldest first.
func (c *Client) Checkpoints(ctx context.Context, root Root) ([]Checkpoint, error) {
	resp := &branchv1.ListCheckpointsResponse{}
	if err := c.t.invoke(ctx, "ListCheckpoints", &branchv1.ListCheckpointsRequest{Root: rootToProto(root)}, resp); err != nil {
		return nil, fromGRPC(err)
	}
	out := make([]Checkpoint, len(resp.Checkpoints))
	for i, ck := range resp.Checkpoints {
		out[i] = checkpointFromProto(ck)
	}
	return out, nil
}

// DeleteCheckpoint removes checkpoint name of root; refused (errdefs
// FailedPrecondition) while a live branch is forked from it. Checkpoints
// built on it keep its layer; they list their parent as "(deleted)".
func (c *Client) DeleteCheckpoint(ctx context.Context, root Root, name string) error {
	if err := c.t.invoke(ctx, "DeleteCheckpoint", &branchv1.DeleteCheckpointRequest{Root: rootToProto(root), Name: name}, &branchv1.DeleteCheckpointResponse{}); err != nil {
		return fromGRPC(err)
	}
	return nil
}

// Rollback brings ref's rootfs back to its checkpoint name, visible at once
// to its running processes; refused while ref has live children.
func (c *Client) Rollback(ctx context.Context, ref Ref, name string) error {
	if err := c.t.invoke(ctx, "Rollback", &branchv1.RollbackRequest{Context: refToProto(ref), Name: name}, &branchv1.RollbackResponse{}); err != nil {
		return fromGRPC(err)
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
	return checkpointFromShim(resp.Checkpoint), nil
}

// Checkpoints lists the checkpoints of the sandbox's contexts.
func (s *SandboxClient) Checkpoints(ctx context.Context) ([]Checkpoint, error) {
	resp, err := s.api.ListCheckpoints(s.ctx(ctx), &shimv1.ListCheckpointsRequest{Sandbox: s.ID})
	if err != nil {
		return nil, fromTTRPC(err)
	}
	out := make([]Checkpoint, len(resp.Checkpoints))
	for i, ck := range resp.Checkpoints {
		out[i] = checkpointFromShim(ck)
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
