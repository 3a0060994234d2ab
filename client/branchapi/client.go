package branchapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	"github.com/branchbox/branchbox/branch"
)

// Client talks to the branch API of a containerd-branch-snapshotter.
type Client struct {
	t transport
}

// ErrNotBranchRoot: a snapshot root is not the branch snapshotter's (a
// rootfs made by another snapshotter, such as overlayfs, whose layout is
// the same).
var ErrNotBranchRoot = fmt.Errorf("its rootfs was not made by the branch snapshotter (another snapshotter, such as overlayfs, made it): run it with --snapshotter branch: %w", errdefs.ErrFailedPrecondition)

// AddressOf returns the socket of the branch snapshotter whose root is
// root (branch.RootOfUpper), from the address file it writes there at
// its start: ErrNotBranchRoot if root is another snapshotter's,
// unavailable if the branch snapshotter has not written it.
func AddressOf(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, branch.AddressFile))
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if _, serr := os.Stat(filepath.Join(root, branch.BranchDBFile)); errors.Is(err, os.ErrNotExist) && errors.Is(serr, os.ErrNotExist) {
		return "", ErrNotBranchRoot
	}
	return "", fmt.Errorf("find the branch snapshotter's socket (is containerd-branch-snapshotter running?): %v: %w", err, errdefs.ErrUnavailable)
}

// Dial connects to the snapshotter's unix socket: over ttrpc where the
// snapshotter serves it beside that socket (address + TTRPCSuffix), else
// over gRPC (a snapshotter older than its ttrpc socket). The choice is made
// at each connection, on first use and after a lost one.
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

// Fork makes n children of ref over its current state.
func (c *Client) Fork(ctx context.Context, ref branch.Ref, n int) ([]branch.Info, error) {
	return c.ForkFrom(ctx, ref, n, "")
}

// ForkFrom makes n children of ref over its checkpoint named from (its
// current state if from is ""). Committing one of them replaces ref's state
// with the child's.
func (c *Client) ForkFrom(ctx context.Context, ref branch.Ref, n int, from string, opts ...ForkOpt) ([]branch.Info, error) {
	if n < 1 {
		return nil, fmt.Errorf("fork: n must be at least 1, got %d: %w", n, errdefs.ErrInvalidArgument)
	}
	req := &branchv1.ForkRequest{Parent: branch.RefToProto(ref), Count: uint32(n), FromCheckpoint: from}
	for _, o := range opts {
		o(req)
	}
	resp := &branchv1.ForkResponse{}
	if err := c.t.invoke(ctx, "Fork", req, resp); err != nil {
		return nil, branch.FromGRPC(err)
	}
	out := make([]branch.Info, len(resp.Branches))
	for i, b := range resp.Branches {
		out[i] = branch.InfoFromProto(b)
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

// Commit makes the leaf branch ref's changes its parent's. A branch that
// lost the race gets a *StaleError.
func (c *Client) Commit(ctx context.Context, ref branch.Ref) (branch.CommitResult, error) {
	resp := &branchv1.CommitResponse{}
	if err := c.t.invoke(ctx, "Commit", &branchv1.CommitRequest{Branch: branch.RefToProto(ref)}, resp); err != nil {
		return branch.CommitResult{}, branch.FromGRPC(err)
	}
	return branch.CommitResult{Parent: branch.InfoFromProto(resp.Parent), Invalidated: resp.Invalidated}, nil
}

// Abort discards ref and its descendants, and returns their IDs.
func (c *Client) Abort(ctx context.Context, ref branch.Ref) ([]string, error) {
	resp := &branchv1.AbortResponse{}
	if err := c.t.invoke(ctx, "Abort", &branchv1.AbortRequest{Branch: branch.RefToProto(ref)}, resp); err != nil {
		return nil, branch.FromGRPC(err)
	}
	return resp.Aborted, nil
}

// Tree returns every node of root's branch tree.
func (c *Client) Tree(ctx context.Context, root branch.Root) ([]branch.Info, error) {
	resp := &branchv1.TreeResponse{}
	if err := c.t.invoke(ctx, "Tree", &branchv1.TreeRequest{Root: branch.RootToProto(root)}, resp); err != nil {
		return nil, branch.FromGRPC(err)
	}
	out := make([]branch.Info, len(resp.Nodes))
	for i, b := range resp.Nodes {
		out[i] = branch.InfoFromProto(b)
		if out[i].ID == branch.RootID {
			out[i].Quarantine = resp.Quarantine
		}
	}
	return out, nil
}

// Mounts returns how to mount ref.
func (c *Client) Mounts(ctx context.Context, ref branch.Ref) ([]mount.Mount, error) {
	resp := &branchv1.MountsResponse{}
	if err := c.t.invoke(ctx, "Mounts", &branchv1.MountsRequest{Branch: branch.RefToProto(ref)}, resp); err != nil {
		return nil, branch.FromGRPC(err)
	}
	return branch.MountsFromProto(resp.Mounts), nil
}

// CheckpointMounts returns a read-only mount of the state of checkpoint
// name, one of ref's own.
func (c *Client) CheckpointMounts(ctx context.Context, ref branch.Ref, name string) ([]mount.Mount, error) {
	resp := &branchv1.MountsResponse{}
	if err := c.t.invoke(ctx, "Mounts", &branchv1.MountsRequest{Branch: branch.RefToProto(ref), Checkpoint: name}, resp); err != nil {
		return nil, branch.FromGRPC(err)
	}
	return branch.MountsFromProto(resp.Mounts), nil
}
