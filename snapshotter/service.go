//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"math"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/containerd/containerd/v2/core/mount"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	"github.com/branchbox/branchbox/branch"
)

// branchService serves the branch API over a snapshotter's Branches.
type branchService struct {
	branchv1.UnimplementedBranchesServer
	s *Branches
}

// NewBranchService returns the gRPC branch service of b.
func NewBranchService(b *Branches) branchv1.BranchesServer {
	return &branchService{s: b}
}

// NewTTRPCBranchService returns the same service for a ttrpc server.
func NewTTRPCBranchService(b *Branches) branchv1.TTRPCBranchesService {
	return &branchService{s: b}
}

// reply is a handler's error as the wire carries it, a failure of the
// snapshotter's storage said in the user's terms (storageErr).
func (b *branchService) reply(err error) error {
	return branch.ToGRPC(b.s.storageErr(err))
}

func (b *branchService) Fork(ctx context.Context, req *branchv1.ForkRequest) (*branchv1.ForkResponse, error) {
	var opts []ForkOption
	if req.GetParentFrozen() {
		opts = append(opts, WithParentFrozen())
	}
	kids, err := b.s.ForkFrom(ctx, branch.RefFromProto(req.GetParent()), int(req.GetCount()), req.GetFromCheckpoint(), opts...)
	if err != nil {
		return nil, b.reply(err)
	}
	resp := &branchv1.ForkResponse{}
	for _, k := range kids {
		resp.Branches = append(resp.Branches, branch.InfoToProto(k))
	}
	return resp, nil
}

func (b *branchService) Commit(ctx context.Context, req *branchv1.CommitRequest) (*branchv1.CommitResponse, error) {
	res, err := b.s.CommitBranch(ctx, branch.RefFromProto(req.GetBranch()))
	if err != nil {
		return nil, b.reply(err)
	}
	return &branchv1.CommitResponse{Parent: branch.InfoToProto(res.Parent), Invalidated: res.Plan.Invalidated}, nil
}

func (b *branchService) Abort(ctx context.Context, req *branchv1.AbortRequest) (*branchv1.AbortResponse, error) {
	gone, err := b.s.Abort(ctx, branch.RefFromProto(req.GetBranch()))
	if err != nil {
		return nil, b.reply(err)
	}
	return &branchv1.AbortResponse{Aborted: gone}, nil
}

func (b *branchService) Tree(ctx context.Context, req *branchv1.TreeRequest) (*branchv1.TreeResponse, error) {
	t, err := b.s.Tree(ctx, branch.RootFromProto(req.GetRoot()))
	if err != nil {
		return nil, b.reply(err)
	}
	resp := &branchv1.TreeResponse{Root: t.Root, Quarantine: t.Quarantine}
	for _, n := range t.Nodes {
		resp.Nodes = append(resp.Nodes, branch.InfoToProto(n))
	}
	return resp, nil
}

func (b *branchService) Mounts(ctx context.Context, req *branchv1.MountsRequest) (*branchv1.MountsResponse, error) {
	var m []mount.Mount
	var err error
	if req.GetCheckpoint() != "" {
		m, err = b.s.CheckpointMounts(ctx, branch.RefFromProto(req.GetBranch()), req.GetCheckpoint())
	} else {
		m, err = b.s.BranchMounts(ctx, branch.RefFromProto(req.GetBranch()))
	}
	if err != nil {
		return nil, b.reply(err)
	}
	return &branchv1.MountsResponse{Mounts: branch.MountsToProto(m)}, nil
}

func (b *branchService) Checkpoint(ctx context.Context, req *branchv1.CheckpointRequest) (*branchv1.CheckpointResponse, error) {
	var opts []branch.CheckpointOpt
	if d := req.GetMemoryDir(); d != "" {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("checkpoint: memory image directory %q is not an absolute path: %w", d, errdefs.ErrInvalidArgument)
		}
		opts = append(opts, branch.WithMemoryImage(d))
	}
	if n, max := req.GetMaxCheckpoints(), req.GetMaxBytes(); n > 0 || max > 0 {
		if n > math.MaxInt32 || max < 0 {
			return nil, fmt.Errorf("checkpoint: bounds of %d checkpoints and %d bytes: %w", n, max, errdefs.ErrInvalidArgument)
		}
		opts = append(opts, branch.WithCheckpointBounds(int(n), max))
	}
	c, err := b.s.Checkpoint(ctx, branch.RefFromProto(req.GetBranch()), req.GetName(), opts...)
	if err != nil {
		return nil, b.reply(err)
	}
	return &branchv1.CheckpointResponse{Checkpoint: branch.CheckpointToProto(c)}, nil
}

func (b *branchService) ListCheckpoints(ctx context.Context, req *branchv1.ListCheckpointsRequest) (*branchv1.ListCheckpointsResponse, error) {
	list, err := b.s.Checkpoints(ctx, branch.RootFromProto(req.GetRoot()))
	if err != nil {
		return nil, b.reply(err)
	}
	resp := &branchv1.ListCheckpointsResponse{}
	for _, c := range list {
		resp.Checkpoints = append(resp.Checkpoints, branch.CheckpointToProto(c))
	}
	return resp, nil
}

func (b *branchService) DeleteCheckpoint(ctx context.Context, req *branchv1.DeleteCheckpointRequest) (*branchv1.DeleteCheckpointResponse, error) {
	if err := b.s.DeleteCheckpoint(ctx, branch.RootFromProto(req.GetRoot()), req.GetName()); err != nil {
		return nil, b.reply(err)
	}
	return &branchv1.DeleteCheckpointResponse{}, nil
}

func (b *branchService) Rollback(ctx context.Context, req *branchv1.RollbackRequest) (*branchv1.RollbackResponse, error) {
	var opts []branch.RollbackOpt
	if req.GetProcesses() {
		opts = append(opts, branch.WithProcesses())
	}
	if err := b.s.Rollback(ctx, branch.RefFromProto(req.GetBranch()), req.GetName(), opts...); err != nil {
		return nil, b.reply(err)
	}
	return &branchv1.RollbackResponse{}, nil
}
