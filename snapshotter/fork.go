//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Fork: children over a context's state (or a checkpoint's), and the seal of
// the parent.

// Fork makes count children of the context c over its current state and
// seals c (its live mounts become read-only) until its last child ends.
func (s *Snapshotter) Fork(ctx context.Context, c branch.Ref, count int) ([]branch.Info, error) {
	return s.ForkFrom(ctx, c, count, "")
}

// ForkFrom is Fork; with a checkpoint named (one of c's own), the children
// start from that checkpoint's state instead of c's current one, and
// committing one replaces c's state with the child's.
func (s *Snapshotter) ForkFrom(ctx context.Context, c branch.Ref, count int, from string, opts ...ForkOption) (_ []branch.Info, retErr error) {
	var o forkOptions
	for _, opt := range opts {
		opt(&o)
	}
	if count < 1 || count > 1024 {
		return nil, fmt.Errorf("fork: count must be between 1 and 1024, got %d: %w", count, errdefs.ErrInvalidArgument)
	}
	var (
		r       rootSnap
		parent  string
		kids    []string
		tree    *branch.Tree
		created []string
		// wasSealed: the parent had live children already, and is sealed.
		wasSealed bool
	)
	// Resolve first, unlocked, to learn which root to lock.
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) (err error) {
		r, parent, err = s.resolve(ctx, c)
		return err
	}); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	if err := s.usable(r); err != nil {
		return nil, fmt.Errorf("fork %s: %w", c, err)
	}
	defer s.locks.lock(r.id())()
	parentUpper := s.contextUpper(r.id(), parent)
	live, err := s.live.Find(parentUpper)
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}

	defer func() {
		if retErr != nil {
			for _, d := range created {
				if err := os.RemoveAll(d); err != nil {
					log.G(ctx).WithError(err).WithField("path", d).Warn("remove directory of failed fork; Cleanup will retry")
				}
			}
		}
	}()
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if r, parent, err = s.resolve(ctx, c); err != nil {
			return err
		}
		if tree, err = loadTree(tx, r.id()); err != nil {
			return err
		}
		if tree == nil {
			tree = branch.NewTree(r.key, time.Now())
		}
		if tree.Depth(parent) >= maxDepth {
			return fmt.Errorf("%s is %d levels deep, the most this snapshotter stacks: %w", c, tree.Depth(parent), errdefs.ErrFailedPrecondition)
		}
		wasSealed = tree.Sealed(parent)
		if kids, err = tree.Fork(parent, count, time.Now()); err != nil {
			return err
		}
		if from != "" {
			d, err := loadCheckpoints(tx, r.id())
			if err != nil {
				return err
			}
			ck := d.Checkpoints[from]
			if ck == nil {
				return fmt.Errorf("no checkpoint named %q in %s: %w", from, branch.DisplayKey(r.key), errdefs.ErrNotFound)
			}
			if ck.Context != parent {
				return fmt.Errorf("checkpoint %q is of context %s, not of the one forked (%s); fork that context: %w", from, ck.Context, parent, errdefs.ErrInvalidArgument)
			}
			for _, id := range kids {
				tree.Nodes[id].FromCheckpoint = from
				tree.Nodes[id].CheckpointLayers = append([]uint64(nil), ck.Chain...)
			}
		}
		// The children's mounts name the id-mapped view; made inside the
		// transaction, which keeps the reaper (that would take a root
		// without a tree for an orphan) out until the tree is stored.
		if err := s.ensureIDMapView(ctx, r); err != nil {
			return err
		}
		uid, gid, err := ownerOf(parentUpper)
		if err != nil {
			return err
		}
		for _, id := range kids {
			dir := s.branchDir(r.id(), id)
			created = append(created, dir)
			if err := makeBranchDir(dir, uid, gid); err != nil {
				return err
			}
		}
		if from != "" {
			// The root of the merged view shows the upper's own root: give
			// it the checkpoint's.
			top := filepath.Join(s.checkpointDir(r.id(), tree.Nodes[kids[0]].CheckpointLayers[0]), "fs")
			for _, id := range kids {
				if err := copyDirAttrs(top, s.contextUpper(r.id(), id)); err != nil {
					return err
				}
			}
		}
		s.fault(FaultForkDirs)
		// Only a mount that was writable is ours to seal and later unseal: a
		// read-only rootfs stays read-only.
		if live.Target != "" && !live.Readonly && !wasSealed {
			p := tree.Nodes[parent]
			p.SealedByUs, p.SealMode, p.SealedMounts = true, branch.SealSuperblock, nil
			if o.parentFrozen {
				p.SealMode = branch.SealCaller
			}
		}
		return storeTree(tx, r.id(), tree)
	})
	if err != nil {
		return nil, fmt.Errorf("fork %s: %w", c, err)
	}
	created = nil
	s.fault(FaultForkCommitted)

	if p := tree.Nodes[parent]; p.SealedByUs && !wasSealed && p.SealMode == branch.SealSuperblock {
		err := s.sealSuperblock(ctx, r.id(), live)
		if errors.Is(err, overlay.ErrSuperblockBusy) {
			err = s.sealEachMount(ctx, r, parent, c.String())
		}
		if err != nil {
			// Undo: the children never existed for anyone.
			if uerr := s.abortAll(ctx, r, kids); uerr != nil {
				log.G(ctx).WithError(uerr).Warn("undo fork after failed seal")
			}
			return nil, fmt.Errorf("fork %s: seal the parent: %w", c, err)
		}
	}
	out := make([]branch.Info, len(kids))
	for i, id := range kids {
		out[i] = branch.Info{Node: *tree.Nodes[id], Mounts: s.contextMounts(r, tree, id, false)}
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "parent": parent, "children": kids}).Info("forked")
	return out, nil
}

// sealSuperblock makes the superblock of the overlay mounted at live
// read-only (overlay.SealThreads.Seal). The caller holds the lock of root
// id; the remount's sync may go on after it returns, and the root's lock is
// not taken again (nor is the tree remounted) before it ends.
func (s *Snapshotter) sealSuperblock(ctx context.Context, id string, live overlay.Live) error {
	run, err := s.seals.Seal(ctx, live)
	if run == nil {
		return err
	}
	done := make(chan struct{})
	s.locks.sealing(id, done)
	ctx = context.WithoutCancel(ctx)
	s.sealWG.Add(1)
	go func() {
		defer s.sealWG.Done()
		defer close(done)
		if err := run.Finish(); err != nil {
			log.G(ctx).WithError(err).WithField("mount", live.Target).Error("seal a forked parent's superblock: the remount failed after it had made the parent read-only")
		}
	}()
	return nil
}

// maxDepth bounds how deep branches nest: each level is one more overlay
// lower layer, and the kernel stacks at most 500.
const maxDepth = 256

func makeBranchDir(dir string, uid, gid int) error {
	// The root's branches directory exists after its first fork: try the
	// one mkdir before MkdirAll's walk.
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create branch directory: %w", err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "fs"), 0o755); err != nil {
		return fmt.Errorf("create branch layer: %w", err)
	}
	if err := os.Lchown(filepath.Join(dir, "fs"), uid, gid); err != nil {
		return fmt.Errorf("chown branch layer: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "work"), 0o711); err != nil {
		return fmt.Errorf("create branch work directory: %w", err)
	}
	return nil
}
