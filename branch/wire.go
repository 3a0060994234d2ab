package branch

// Conversions between the shared types and the wire (the branch API's
// protobuf messages and gRPC/ttrpc statuses), for servers and clients.

import (
	"errors"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	typesv1 "github.com/branchbox/branchbox/api/types/v1"
)

// ToGRPC converts an error for a gRPC or ttrpc reply: errdefs kinds become
// status codes, and a *StaleError also carries its winner and epoch as
// status details, so that clients get a *StaleError back, not only text.
// Servers of the branch APIs (snapshotter, shim) answer with it.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	var se *StaleError
	if errors.As(err, &se) {
		st, derr := status.New(codes.Aborted, err.Error()).WithDetails(&branchv1.StaleDetail{
			Branch: se.Branch, Winner: se.Winner, WinnerEpoch: se.WinnerEpoch,
		})
		if derr == nil {
			return st.Err()
		}
	}
	var we *WritersError
	if errors.As(err, &we) {
		d := &branchv1.WritersDetail{Branch: we.Branch}
		for _, w := range we.Writers {
			d.Writers = append(d.Writers, &branchv1.Writer{Pid: int32(w.Pid), Command: w.Command, Path: w.Path})
		}
		st, derr := status.New(codes.FailedPrecondition, err.Error()).WithDetails(d)
		if derr == nil {
			return st.Err()
		}
	}
	var be *CheckpointBoundError
	if errors.As(err, &be) {
		st, derr := status.New(codes.ResourceExhausted, err.Error()).WithDetails(&branchv1.CheckpointBoundDetail{
			Count: uint32(be.Count), MaxCheckpoints: uint32(be.MaxCheckpoints),
			Bytes: be.Bytes, DeletedBytes: be.DeletedBytes, NewBytes: be.NewBytes, MaxBytes: be.MaxBytes,
		})
		if derr == nil {
			return st.Err()
		}
	}
	return errgrpc.ToGRPC(err)
}

// FromGRPC restores errdefs kinds, and a *StaleError from its details. An
// error that is not a status (the transport's own) is kept as it is.
func FromGRPC(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if st.Code() == codes.Aborted {
		for _, d := range st.Details() {
			if sd, ok := d.(*branchv1.StaleDetail); ok {
				return &StaleError{Branch: sd.Branch, Winner: sd.Winner, WinnerEpoch: sd.WinnerEpoch}
			}
		}
	}
	if st.Code() == codes.FailedPrecondition {
		for _, d := range st.Details() {
			if wd, ok := d.(*branchv1.WritersDetail); ok {
				we := &WritersError{Branch: wd.Branch}
				for _, w := range wd.Writers {
					we.Writers = append(we.Writers, Writer{Pid: int(w.Pid), Command: w.Command, Path: w.Path})
				}
				return we
			}
		}
	}
	if st.Code() == codes.ResourceExhausted {
		for _, d := range st.Details() {
			if bd, ok := d.(*branchv1.CheckpointBoundDetail); ok {
				return &CheckpointBoundError{Count: int(bd.Count), MaxCheckpoints: int(bd.MaxCheckpoints),
					Bytes: bd.Bytes, DeletedBytes: bd.DeletedBytes, NewBytes: bd.NewBytes, MaxBytes: bd.MaxBytes,
					Message: st.Message()}
			}
		}
	}
	return errgrpc.ToNative(err)
}

func RootToProto(r Root) *branchv1.Root {
	if r.Upperdir != "" && r.Key == "" {
		return &branchv1.Root{Ref: &branchv1.Root_Upperdir{Upperdir: r.Upperdir}}
	}
	return &branchv1.Root{Ref: &branchv1.Root_Key{Key: r.Key}}
}

func RefToProto(r Ref) *branchv1.BranchRef {
	return &branchv1.BranchRef{Root: RootToProto(r.Root), Branch: r.Branch}
}

func MountsFromProto(ms []*branchv1.Mount) []mount.Mount {
	out := make([]mount.Mount, len(ms))
	for i, m := range ms {
		out[i] = mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options}
	}
	return out
}

func InfoFromProto(b *branchv1.Branch) Info {
	i := Info{
		Node: Node{
			ID: b.Id, Parent: b.Parent, State: StateFromProto(b.State), Epoch: b.Epoch, ForkEpoch: b.ForkEpoch,
			Winner: b.Winner, WinnerEpoch: b.WinnerEpoch, FromCheckpoint: b.FromCheckpoint,
		},
		Sealed: b.Sealed, Children: b.Children, UpperSize: b.UpperSize, UpperInodes: b.UpperInodes,
		Mounts: MountsFromProto(b.Mounts),
	}
	if b.Created != nil {
		i.Created = b.Created.AsTime()
	}
	if b.Ended != nil {
		i.Ended = b.Ended.AsTime()
	}
	return i
}

// RootFromProto is RootToProto's inverse.
func RootFromProto(r *branchv1.Root) Root {
	return Root{Key: r.GetKey(), Upperdir: r.GetUpperdir()}
}

// RefFromProto is RefToProto's inverse.
func RefFromProto(r *branchv1.BranchRef) Ref {
	return Ref{Root: RootFromProto(r.GetRoot()), Branch: r.GetBranch()}
}

// MountsToProto is MountsFromProto's inverse.
func MountsToProto(ms []mount.Mount) []*branchv1.Mount {
	out := make([]*branchv1.Mount, len(ms))
	for i, m := range ms {
		out[i] = &branchv1.Mount{Type: m.Type, Source: m.Source, Options: m.Options}
	}
	return out
}

// InfoToProto is InfoFromProto's inverse.
func InfoToProto(i Info) *branchv1.Branch {
	b := &branchv1.Branch{
		Id:          i.ID,
		Parent:      i.Parent,
		State:       StateToProto(i.State),
		Epoch:       i.Epoch,
		ForkEpoch:   i.ForkEpoch,
		Winner:      i.Winner,
		WinnerEpoch: i.WinnerEpoch,
		UpperSize:   i.UpperSize,
		UpperInodes: i.UpperInodes,
		Sealed:      i.Sealed,
		Children:    i.Children,
		Mounts:      MountsToProto(i.Mounts),

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

// StateToProto converts a State for the wire.
func StateToProto(s State) branchv1.State {
	switch s {
	case Live:
		return branchv1.State_STATE_LIVE
	case Committing:
		return branchv1.State_STATE_COMMITTING
	case Committed:
		return branchv1.State_STATE_COMMITTED
	case Aborted:
		return branchv1.State_STATE_ABORTED
	case Stale:
		return branchv1.State_STATE_STALE
	}
	return branchv1.State_STATE_UNSPECIFIED
}

// StateFromProto converts a State from the wire.
func StateFromProto(p branchv1.State) State {
	switch p {
	case branchv1.State_STATE_LIVE:
		return Live
	case branchv1.State_STATE_COMMITTING:
		return Committing
	case branchv1.State_STATE_COMMITTED:
		return Committed
	case branchv1.State_STATE_ABORTED:
		return Aborted
	case branchv1.State_STATE_STALE:
		return Stale
	}
	return ""
}

// CheckpointFromProto converts a checkpoint from either API.
func CheckpointFromProto(c *typesv1.Checkpoint) Checkpoint {
	if c == nil {
		return Checkpoint{}
	}
	out := Checkpoint{Name: c.Name, Branch: c.Branch, Parent: c.Parent, Size: c.Size, Entries: c.Entries,
		Depth: int(c.Depth), Head: c.Head, Children: c.Children, Branches: c.Branches,
		MemoryBytes: c.MemoryBytes, MemoryDir: c.MemoryDir}
	if c.Created != nil {
		out.Created = c.Created.AsTime()
	}
	return out
}

// CheckpointToProto converts a checkpoint for either API.
func CheckpointToProto(c Checkpoint) *typesv1.Checkpoint {
	out := &typesv1.Checkpoint{Name: c.Name, Branch: c.Branch, Parent: c.Parent, Size: c.Size, Entries: c.Entries,
		Depth: uint32(c.Depth), Head: c.Head, Children: c.Children, Branches: c.Branches,
		MemoryBytes: c.MemoryBytes, MemoryDir: c.MemoryDir}
	if !c.Created.IsZero() {
		out.Created = timestamppb.New(c.Created)
	}
	return out
}
