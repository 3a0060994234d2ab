package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// Checkpoints are the snapshotter's business: the shim only names the
// sandbox's snapshot for it, holding the sandbox's lock so that a checkpoint
// or rollback never interleaves with a fork, commit or abort from this shim.

func (c *Service) lockedSandbox(ctx context.Context, id string) (*Sandbox, context.Context, func(), error) {
	sb, err := c.Sandbox(id)
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

// Checkpoint records the state of a branch of the sandbox.
func (c *Service) Checkpoint(ctx context.Context, req *shimv1.CheckpointRequest) (_ *shimv1.CheckpointResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	ctx, stop := callerDeadline(ctx)
	defer stop()
	sb, ctx, unlock, err := c.lockedSandbox(ctx, req.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// The caller's error must mean "not made": cut at its deadline (which
	// ttrpc carries here) or when it left, the call to the snapshotter
	// returned while the snapshotter went on, and the checkpoint appeared
	// after the error, a retry under its name refused "already exists".
	// So the work runs to its end under the sandbox's lock, and what was
	// made after the caller left is deleted before the next call sees it.
	work := context.WithoutCancel(ctx)
	var ck branch.Checkpoint
	if req.Memory {
		ck, err = c.memoryCheckpoint(work, sb, rootOr(req.Branch), req.Name)
	} else {
		ck, err = sb.snapshot.Checkpoint(work, sb.ref(rootOr(req.Branch)), req.Name, sb.checkpointBounds())
		if sb.releasing.retryForRoom(work, err) {
			ck, err = sb.snapshot.Checkpoint(work, sb.ref(rootOr(req.Branch)), req.Name, sb.checkpointBounds())
		}
	}
	if err != nil {
		return nil, sb.checkpointRefused(req.Name, err, isSelfCaller(ctx))
	}
	if left := ctx.Err(); left != nil {
		return nil, c.unmakeCheckpoint(work, sb, req.Name, left)
	}
	return &shimv1.CheckpointResponse{Checkpoint: branch.CheckpointToProto(ck)}, nil
}

// unmakeCheckpoint deletes checkpoint name, made after its caller left
// (left is why), and says so.
func (c *Service) unmakeCheckpoint(ctx context.Context, sb *Sandbox, name string, left error) error {
	if err := sb.snapshot.DeleteCheckpoint(ctx, sb.root(), name); err != nil {
		log.G(ctx).WithError(err).WithFields(log.Fields{"sandbox": sb.id, "checkpoint": name}).Warn("delete a checkpoint made after its caller left")
		return fmt.Errorf("checkpoint %q of %s: made after its caller left, and kept (deleting it failed: %v): %w", name, sb.id, err, left)
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "checkpoint": name}).Info("checkpoint made after its caller left: deleted")
	return fmt.Errorf("checkpoint %q of %s: its caller left before it was made; not kept: %w", name, sb.id, left)
}

// ListCheckpoints lists the checkpoints of the sandbox's branches.
func (c *Service) ListCheckpoints(ctx context.Context, req *shimv1.ListCheckpointsRequest) (_ *shimv1.ListCheckpointsResponse, retErr error) {
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
func (c *Service) DeleteCheckpoint(ctx context.Context, req *shimv1.DeleteCheckpointRequest) (_ *shimv1.Empty, retErr error) {
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

// Rollback brings a branch of the sandbox back to a checkpoint, through
// its live rootfs mount: its running processes see it at once.
func (c *Service) Rollback(ctx context.Context, req *shimv1.RollbackRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, ctx, unlock, err := c.lockedSandbox(ctx, req.Sandbox)
	if err != nil {
		return nil, err
	}
	defer unlock()
	id := rootOr(req.Branch)
	if n := sb.nodes[id]; n != nil && n.container != nil {
		// Its processes are the runtime's: a checkpoint with memory
		// brings them back too.
		ck, err := c.checkpointNamed(ctx, sb, req.Name)
		if err != nil {
			return nil, err
		}
		if ck.MemoryBytes > 0 {
			if err := c.rollbackMemory(ctx, sb, n, ck); err != nil {
				return nil, err
			}
			return &shimv1.Empty{}, nil
		}
	}
	err = sb.snapshot.Rollback(ctx, sb.ref(id), req.Name)
	if sb.releasing.retryForRoom(ctx, err) {
		err = sb.snapshot.Rollback(ctx, sb.ref(id), req.Name)
	}
	if errdefs.IsFailedPrecondition(err) {
		ck, lerr := c.checkpointNamed(ctx, sb, req.Name)
		if lerr != nil {
			// The refusal may be for the processes the checkpoint holds,
			// which the shim would restore: the error is the lookup's (a
			// snapshotter gone meanwhile: unavailable, to retry).
			return nil, fmt.Errorf("rollback of %s to %q: whether the checkpoint holds processes: %w (the snapshotter refused its files alone: %v)", sb.id, req.Name, lerr, err)
		}
		if ck.MemoryBytes > 0 {
			if root := sb.nodes[branch.RootID]; id == branch.RootID && root != nil {
				if err := c.rollbackRoot(ctx, sb, root, ck); err != nil {
					return nil, err
				}
				return &shimv1.Empty{}, nil
			}
			return nil, fmt.Errorf("rollback of branch %s of %s to %q: it holds processes, and the branch runs on the branch init, whose processes cannot be restored: %w", id, sb.id, req.Name, errdefs.ErrNotImplemented)
		}
	}
	if err != nil {
		return nil, err
	}
	return &shimv1.Empty{}, nil
}

// checkpointNamed is the sandbox's checkpoint name.
func (c *Service) checkpointNamed(ctx context.Context, sb *Sandbox, name string) (branch.Checkpoint, error) {
	list, err := sb.snapshot.Checkpoints(ctx, sb.root())
	if err != nil {
		return branch.Checkpoint{}, err
	}
	for _, ck := range list {
		if ck.Name == name {
			return ck, nil
		}
	}
	return branch.Checkpoint{}, fmt.Errorf("no checkpoint named %q in %s: %w", name, sb.id, errdefs.ErrNotFound)
}

// memoryCheckpoint is Checkpoint with the branch's processes.
func (c *Service) memoryCheckpoint(ctx context.Context, sb *Sandbox, id, name string) (branch.Checkpoint, error) {
	if c.Paused(sb) {
		return branch.Checkpoint{}, PausedError(sb)
	}
	n, ok := sb.nodes[id]
	if !ok {
		if _, err := sb.snapshot.Mounts(ctx, sb.ref(id)); err != nil {
			return branch.Checkpoint{}, err
		}
		return branch.Checkpoint{}, fmt.Errorf("branch %s of %s is not running: %w", id, sb.id, errdefs.ErrNotFound)
	}
	return c.checkpointMemory(ctx, sb, n, name)
}

// checkpointBounds are the sandbox's bounds on its checkpoints, which the
// snapshotter applies as it records one.
func (sb *Sandbox) checkpointBounds() branch.CheckpointOpt {
	return branch.WithCheckpointBounds(sb.bounds.maxCheckpoints, sb.bounds.maxCheckpointBytes)
}

// checkBoundsBefore refuses a checkpoint the sandbox's checkpoints have no
// room for before any work on it (a dump of its processes): from the
// listed ones, as the snapshotter counts them; deleted checkpoints' layers
// it counts too only when it records the checkpoint.
func (sb *Sandbox) checkBoundsBefore(ctx context.Context) error {
	list, err := sb.snapshot.Checkpoints(ctx, sb.root())
	if err != nil {
		return err
	}
	var bytes int64
	for _, ck := range list {
		bytes += ck.Size + ck.MemoryBytes
	}
	o := branch.CheckpointOptions{MaxCheckpoints: sb.bounds.maxCheckpoints, MaxBytes: sb.bounds.maxCheckpointBytes}
	return branch.CheckCheckpointBounds(o, len(list), bytes, 0, 0)
}

// checkpointRefused words a checkpoint the sandbox's bounds refused for
// its user: which bound, where it was set, what to do (from inside, with
// branchctl self). The answer is still a *branch.CheckpointBoundError, so
// that clients past the shim (the HTTP API, MCP) can tell a bound from a
// full disk.
func (sb *Sandbox) checkpointRefused(name string, err error, self bool) error {
	var be *branch.CheckpointBoundError
	if !errors.As(err, &be) {
		return err
	}
	worded := *be
	worded.Message = sb.boundWords(name, be, self)
	return &worded
}

func (sb *Sandbox) boundWords(name string, be *branch.CheckpointBoundError, self bool) string {
	what := fmt.Sprintf("checkpoint %q of sandbox %s", name, sb.id)
	rm := "branchctl checkpoint rm " + sb.id + " NAME"
	if self {
		rm = "branchctl self checkpoint rm NAME"
	}
	if be.OverCount() {
		return fmt.Sprintf("%s: it has %s, its maximum (%s): delete some first (%s): %v",
			what, counted(be.Count, "checkpoint", "checkpoints"), sb.bounds.checkpointsFrom, rm, errdefs.ErrResourceExhausted)
	}
	held := branch.Bytes(be.Bytes)
	deleted := ""
	if be.DeletedBytes > 0 {
		held += fmt.Sprintf(" (%s of it deleted checkpoints' layers that later ones build on)", branch.Bytes(be.DeletedBytes))
		deleted = "; a deleted checkpoint's layer counts until no later checkpoint builds on it"
	}
	past := "their maximum"
	if be.NewBytes > 0 {
		past = fmt.Sprintf("and this one's %s would take them past their maximum", branch.Bytes(be.NewBytes))
	}
	return fmt.Sprintf("%s: its checkpoints hold %s, %s of %s (%s): delete some first (%s)%s: %v",
		what, held, past, branch.Bytes(be.MaxBytes), sb.bounds.checkpointBytesFrom, rm, deleted, errdefs.ErrResourceExhausted)
}

func rootOr(id string) string {
	if id == "" {
		return branch.RootID
	}
	return id
}
