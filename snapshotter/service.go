//go:build linux

package snapshotter

import (
	"context"

	"github.com/containerd/containerd/v2/core/mount"
	"google.golang.org/protobuf/types/known/timestamppb"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	"github.com/branchbox/branchbox/branch"
)

// branchService serves the branch API over a Snapshotter.
type branchService struct {
	branchv1.UnimplementedBranchesServer
	s *Snapshotter
}

// NewBranchService returns the gRPC branch service of s.
func NewBranchService(s *Snapshotter) branchv1.BranchesServer {
	return &branchService{s: s}
}

// NewTTRPCBranchService returns the same service for a ttrpc server.
func NewTTRPCBranchService(s *Snapshotter) branchv1.TTRPCBranchesService {
	return &branchService{s: s}
}

func (b *branchService) Fork(ctx context.Context, req *branchv1.ForkRequest) (*branchv1.ForkResponse, error) {
	var opts []ForkOption
	if req.GetParentFrozen() {
		opts = append(opts, WithParentFrozen())
	}
	kids, err := b.s.ForkFrom(ctx, contextFromProto(req.GetParent()), int(req.GetCount()), req.GetFromCheckpoint(), opts...)
	if err != nil {
		return nil, branch.ToGRPC(err)
	}
	resp := &branchv1.ForkResponse{}
	for _, k := range kids {
		resp.Branches = append(resp.Branches, infoToProto(k))
	}
	return resp, nil
}

func (b *branchService) Commit(ctx context.Context, req *branchv1.CommitRequest) (*branchv1.CommitResponse, error) {
	res, err := b.s.CommitBranch(ctx, contextFromProto(req.GetBranch()))
	if err != nil {
		return nil, branch.ToGRPC(err)
	}
	return &branchv1.CommitResponse{Parent: infoToProto(res.Parent), Invalidated: res.Plan.Invalidated}, nil
}

func (b *branchService) Abort(ctx context.Context, req *branchv1.AbortRequest) (*branchv1.AbortResponse, error) {
	gone, err := b.s.Abort(ctx, contextFromProto(req.GetBranch()))
	if err != nil {
		return nil, branch.ToGRPC(err)
	}
	return &branchv1.AbortResponse{Aborted: gone}, nil
}

func (b *branchService) Tree(ctx context.Context, req *branchv1.TreeRequest) (*branchv1.TreeResponse, error) {
	t, err := b.s.Tree(ctx, rootFromProto(req.GetRoot()))
	if err != nil {
		return nil, branch.ToGRPC(err)
	}
	resp := &branchv1.TreeResponse{Root: t.Root, Quarantine: t.Quarantine}
	for _, n := range t.Nodes {
		resp.Nodes = append(resp.Nodes, infoToProto(n))
	}
	return resp, nil
}

func (b *branchService) Mounts(ctx context.Context, req *branchv1.MountsRequest) (*branchv1.MountsResponse, error) {
	var m []mount.Mount
	var err error
	if req.GetCheckpoint() != "" {
		m, err = b.s.CheckpointMounts(ctx, contextFromProto(req.GetContext()), req.GetCheckpoint())
	} else {
		m, err = b.s.BranchMounts(ctx, contextFromProto(req.GetContext()))
	}
	if err != nil {
		return nil, branch.ToGRPC(err)
	}
	return &branchv1.MountsResponse{Mounts: mountsToProto(m)}, nil
}

func rootFromProto(r *branchv1.Root) Root {
	return Root{Key: r.GetKey(), Upperdir: r.GetUpperdir()}
}

func contextFromProto(c *branchv1.Context) Context {
	return Context{Root: rootFromProto(c.GetRoot()), Branch: c.GetBranch()}
}

func mountsToProto(ms []mount.Mount) []*branchv1.Mount {
	out := make([]*branchv1.Mount, len(ms))
	for i, m := range ms {
		out[i] = &branchv1.Mount{Type: m.Type, Source: m.Source, Options: m.Options}
	}
	return out
}

func infoToProto(i BranchInfo) *branchv1.Branch {
	b := &branchv1.Branch{
		Id:          i.ID,
		Parent:      i.Parent,
		State:       branch.StateToProto(i.State),
		Epoch:       i.Epoch,
		ForkEpoch:   i.ForkEpoch,
		Winner:      i.Winner,
		WinnerEpoch: i.WinnerEpoch,
		UpperSize:   i.UpperSize,
		UpperInodes: i.UpperInodes,
		Sealed:      i.Sealed,
		Children:    i.Children,
		Mounts:      mountsToProto(i.Mounts),

		FromCheckpoint: i.FromCheckpoint,
	}
	if !i.Created.IsZero() {
		b.Created = timestamppb.New(i.Created)
	}
	if !i.Ended.IsZero() {
		b.Ended = timestamppb.New(i.Ended)
	}
	return b
}

func (b *branchService) Checkpoint(ctx context.Context, req *branchv1.CheckpointRequest) (*branchv1.CheckpointResponse, error) {
	c, err := b.s.Checkpoint(ctx, contextFromProto(req.GetContext()), req.GetName())
	if err != nil {
		return nil, branch.ToGRPC(err)
	}
	return &branchv1.CheckpointResponse{Checkpoint: branch.CheckpointToProto(c)}, nil
}

func (b *branchService) ListCheckpoints(ctx context.Context, req *branchv1.ListCheckpointsRequest) (*branchv1.ListCheckpointsResponse, error) {
	list, err := b.s.Checkpoints(ctx, rootFromProto(req.GetRoot()))
	if err != nil {
		return nil, branch.ToGRPC(err)
	}
	resp := &branchv1.ListCheckpointsResponse{}
	for _, c := range list {
		resp.Checkpoints = append(resp.Checkpoints, branch.CheckpointToProto(c))
	}
	return resp, nil
}

func (b *branchService) DeleteCheckpoint(ctx context.Context, req *branchv1.DeleteCheckpointRequest) (*branchv1.DeleteCheckpointResponse, error) {
	if err := b.s.DeleteCheckpoint(ctx, rootFromProto(req.GetRoot()), req.GetName()); err != nil {
		return nil, branch.ToGRPC(err)
	}
	return &branchv1.DeleteCheckpointResponse{}, nil
}

func (b *branchService) Rollback(ctx context.Context, req *branchv1.RollbackRequest) (*branchv1.RollbackResponse, error) {
	if err := b.s.Rollback(ctx, contextFromProto(req.GetContext()), req.GetName()); err != nil {
		return nil, branch.ToGRPC(err)
	}
	return &branchv1.RollbackResponse{}, nil
}
