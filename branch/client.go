package branch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
)

// Client talks to the branch API of a containerd-branch-snapshotter.
type Client struct {
	t transport
}

// Dial connects to the snapshotter's unix socket: over ttrpc where the
// snapshotter serves it beside that socket (address + TTRPCSuffix), else
// over gRPC. Either connects on first use.
func Dial(address string) (*Client, error) {
	return DialNotify(address, nil)
}

// DialNotify is Dial with onDrop called, on a goroutine of its own, each
// time the connection is lost (the snapshotter exited or restarted), so
// that a caller holding state that must agree with the snapshotter's can
// check it again once the snapshotter is back.
func DialNotify(address string, onDrop func()) (*Client, error) {
	t, err := dialTransport(address, onDrop)
	if err != nil {
		return nil, err
	}
	return &Client{t: t}, nil
}

// Generation counts the connections to the snapshotter lost so far (over
// ttrpc; always 0 over gRPC). A change since a caller last looked means
// the snapshotter may have restarted, finishing decided commits.
func (c *Client) Generation() uint64 { return c.t.generation() }

// Close closes the connection.
func (c *Client) Close() error { return c.t.Close() }

// Root names a root snapshot by key or by upper directory.
type Root struct {
	Key      string
	Upperdir string
}

// Ref names a context: the root (Branch "" or RootID) or a branch of it.
type Ref struct {
	Root   Root
	Branch string
}

// Info is one node of a branch tree as the snapshotter reports it.
type Info struct {
	Node
	Sealed      bool
	Children    []string
	UpperSize   int64
	UpperInodes int64
	Mounts      []mount.Mount
	// Quarantine, on the root context (RootID) of a tree whose recovery
	// failed in the snapshotter, says why; its branch operations are
	// refused until a retry succeeds.
	Quarantine string
}

// Fork makes n children of ref over its current state.
func (c *Client) Fork(ctx context.Context, ref Ref, n int) ([]Info, error) {
	return c.ForkFrom(ctx, ref, n, "")
}

// ForkFrom makes n children of ref over its checkpoint named from (its
// current state if from is ""). Committing one of them replaces ref's state
// with the child's.
func (c *Client) ForkFrom(ctx context.Context, ref Ref, n int, from string, opts ...ForkOpt) ([]Info, error) {
	if n < 1 {
		return nil, fmt.Errorf("fork: n must be at least 1, got %d: %w", n, errdefs.ErrInvalidArgument)
	}
	req := &branchv1.ForkRequest{Parent: refToProto(ref), Count: uint32(n), FromCheckpoint: from}
	for _, o := range opts {
		o(req)
	}
	resp := &branchv1.ForkResponse{}
	if err := c.t.invoke(ctx, "Fork", req, resp); err != nil {
		return nil, fromGRPC(err)
	}
	out := make([]Info, len(resp.Branches))
	for i, b := range resp.Branches {
		out[i] = infoFromProto(b)
	}
	return out, nil
}

// ForkOpt is an option of ForkFrom.
type ForkOpt func(*branchv1.ForkRequest)

// WithParentFrozen tells the snapshotter that the caller froze every
// process of the parent: the seal is the caller's, and the snapshotter
// leaves the parent's rootfs as it is (files open for writing by the
// frozen processes then do not stop the fork).
func WithParentFrozen() ForkOpt {
	return func(r *branchv1.ForkRequest) { r.ParentFrozen = true }
}

// CommitResult is the parent after a commit and the branches it invalidated.
type CommitResult struct {
	Parent      Info
	Invalidated []string
}

// Commit makes the leaf branch ref's changes its parent's. A branch that
// lost the race gets a *StaleError.
func (c *Client) Commit(ctx context.Context, ref Ref) (CommitResult, error) {
	resp := &branchv1.CommitResponse{}
	if err := c.t.invoke(ctx, "Commit", &branchv1.CommitRequest{Branch: refToProto(ref)}, resp); err != nil {
		return CommitResult{}, fromGRPC(err)
	}
	return CommitResult{Parent: infoFromProto(resp.Parent), Invalidated: resp.Invalidated}, nil
}

// Abort discards ref and its descendants, and returns their IDs.
func (c *Client) Abort(ctx context.Context, ref Ref) ([]string, error) {
	resp := &branchv1.AbortResponse{}
	if err := c.t.invoke(ctx, "Abort", &branchv1.AbortRequest{Branch: refToProto(ref)}, resp); err != nil {
		return nil, fromGRPC(err)
	}
	return resp.Aborted, nil
}

// Tree returns every node of root's branch tree.
func (c *Client) Tree(ctx context.Context, root Root) ([]Info, error) {
	resp := &branchv1.TreeResponse{}
	if err := c.t.invoke(ctx, "Tree", &branchv1.TreeRequest{Root: rootToProto(root)}, resp); err != nil {
		return nil, fromGRPC(err)
	}
	out := make([]Info, len(resp.Nodes))
	for i, b := range resp.Nodes {
		out[i] = infoFromProto(b)
		if out[i].ID == RootID {
			out[i].Quarantine = resp.Quarantine
		}
	}
	return out, nil
}

// Mounts returns how to mount ref.
func (c *Client) Mounts(ctx context.Context, ref Ref) ([]mount.Mount, error) {
	resp := &branchv1.MountsResponse{}
	if err := c.t.invoke(ctx, "Mounts", &branchv1.MountsRequest{Context: refToProto(ref)}, resp); err != nil {
		return nil, fromGRPC(err)
	}
	return mountsFromProto(resp.Mounts), nil
}

// CheckpointMounts returns a read-only mount of the state of checkpoint
// name, one of ref's own.
func (c *Client) CheckpointMounts(ctx context.Context, ref Ref, name string) ([]mount.Mount, error) {
	resp := &branchv1.MountsResponse{}
	if err := c.t.invoke(ctx, "Mounts", &branchv1.MountsRequest{Context: refToProto(ref), Checkpoint: name}, resp); err != nil {
		return nil, fromGRPC(err)
	}
	return mountsFromProto(resp.Mounts), nil
}

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
		d := &branchv1.WritersDetail{Context: we.Context}
		for _, w := range we.Writers {
			d.Writers = append(d.Writers, &branchv1.Writer{Pid: int32(w.Pid), Command: w.Command, Path: w.Path})
		}
		st, derr := status.New(codes.FailedPrecondition, err.Error()).WithDetails(d)
		if derr == nil {
			return st.Err()
		}
	}
	return errgrpc.ToGRPC(err)
}

// fromGRPC restores errdefs kinds, and a *StaleError from its details. An
// error that is not a status (the transport's own) is kept as it is.
func fromGRPC(err error) error {
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
				we := &WritersError{Context: wd.Context}
				for _, w := range wd.Writers {
					we.Writers = append(we.Writers, Writer{Pid: int(w.Pid), Command: w.Command, Path: w.Path})
				}
				return we
			}
		}
	}
	return errgrpc.ToNative(err)
}

func rootToProto(r Root) *branchv1.Root {
	if r.Upperdir != "" && r.Key == "" {
		return &branchv1.Root{Ref: &branchv1.Root_Upperdir{Upperdir: r.Upperdir}}
	}
	return &branchv1.Root{Ref: &branchv1.Root_Key{Key: r.Key}}
}

func refToProto(r Ref) *branchv1.Context {
	return &branchv1.Context{Root: rootToProto(r.Root), Branch: r.Branch}
}

func mountsFromProto(ms []*branchv1.Mount) []mount.Mount {
	out := make([]mount.Mount, len(ms))
	for i, m := range ms {
		out[i] = mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options}
	}
	return out
}

func infoFromProto(b *branchv1.Branch) Info {
	i := Info{
		Node: Node{
			ID: b.Id, Parent: b.Parent, State: StateFromProto(b.State), Epoch: b.Epoch, ForkEpoch: b.ForkEpoch,
			Winner: b.Winner, WinnerEpoch: b.WinnerEpoch, FromCheckpoint: b.FromCheckpoint,
		},
		Sealed: b.Sealed, Children: b.Children, UpperSize: b.UpperSize, UpperInodes: b.UpperInodes,
		Mounts: mountsFromProto(b.Mounts),
	}
	if b.Created != nil {
		i.Created = b.Created.AsTime()
	}
	if b.Ended != nil {
		i.Ended = b.Ended.AsTime()
	}
	return i
}

// Age is how long ago the context was created.
func (i Info) Age(now time.Time) time.Duration { return now.Sub(i.Created) }

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
