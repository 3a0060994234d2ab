//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Abort: a branch and its descendants discarded, and the parent unsealed when
// it has no live child left.

// abortAll discards the given branches of r (used to undo a failed fork).
func (s *Branches) abortAll(ctx context.Context, r rootSnap, ids []string) error {
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, err := loadTree(tx, r.id())
		if err != nil || tree == nil {
			return err
		}
		for _, id := range ids {
			if _, err := tree.Abort(id, time.Now()); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
		for id, n := range tree.Nodes {
			if n.SealedByUs && !tree.Sealed(id) {
				clearSeal(n)
			}
		}
		return storeTree(tx, r.id(), tree)
	})
	if err != nil {
		return err
	}
	mounts := overlayMountsOrNone(ctx)
	for _, id := range ids {
		s.removeBranchLayer(ctx, mounts, r.id(), id)
	}
	return nil
}

// Abort discards branch c and its descendants. Its parent is unsealed when
// its last child ends. A committing branch whose apply failed and was put
// back (see CommitBranch) is abandoned: its parent stays as it was.
func (s *Branches) Abort(ctx context.Context, c branch.Ref) ([]string, error) {
	var (
		r    rootSnap
		id   string
		gone []string
		tree *branch.Tree
	)
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) (err error) {
		r, id, err = s.resolve(ctx, c)
		return err
	}); err != nil {
		return nil, fmt.Errorf("abort: %w", err)
	}
	if err := s.usable(r); err != nil {
		return nil, fmt.Errorf("abort %s: %w", c, err)
	}
	defer s.locks.lock(r.id())()
	// Read once, under the lock: it serves the unseal and the removals.
	mounts := overlayMountsOrNone(ctx)
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if r, id, err = s.resolve(ctx, c); err != nil {
			return err
		}
		if tree, err = loadTree(tx, r.id()); err != nil {
			return err
		}
		if tree == nil {
			tree = branch.NewTree(r.key, time.Now())
		}
		var parent string
		if n := tree.Nodes[id]; n != nil && n.State == branch.Committing {
			// A commit that was decided but could not be applied: abandoned,
			// if its parent was put back as it was.
			if !s.undone.isClean(r.id(), id) {
				return fmt.Errorf("branch %s is being committed into %s, which may hold part of it; call commit again to complete it: %w", id, branchName(n.Parent), errdefs.ErrFailedPrecondition)
			}
			parent, gone = n.Parent, []string{id}
			if err := tree.AbandonCommit(id, time.Now()); err != nil {
				return err
			}
		} else {
			n, err := tree.Get(id)
			if err != nil {
				return fmt.Errorf("abort: %w", err)
			}
			parent = n.Parent
			if gone, err = tree.Abort(id, time.Now()); err != nil {
				return err
			}
		}
		// The last child of a sealed parent: unseal it before the abort
		// commits. A crash in between leaves the parent writable with the
		// child still recorded, which recovery seals again.
		if p := tree.Nodes[parent]; p != nil && p.SealedByUs && !tree.Sealed(parent) {
			if err := s.setSealed(ctx, mounts, s.branchUpper(r.id(), parent), p, false); err != nil {
				return fmt.Errorf("unseal parent: %w", err)
			}
			clearSeal(p)
		}
		return storeTree(tx, r.id(), tree)
	})
	if err != nil {
		return nil, fmt.Errorf("abort %s: %w", c, err)
	}
	s.undone.set(r.id(), id, false)
	s.fault(FaultAbortDecided)
	for _, g := range gone {
		s.removeBranchLayer(ctx, mounts, r.id(), g)
	}
	s.removeCheckpointOrphans(ctx, r.id())
	s.fault(FaultAbortRemoved)
	log.G(ctx).WithFields(log.Fields{"root": r.key, "aborted": gone}).Info("aborted")
	return gone, nil
}

// unsealIdle makes writable again every branch of r that was sealed by a
// fork and has no live children left.
func (s *Branches) unsealIdle(ctx context.Context, r rootSnap) error {
	idle := false
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		t, err := loadTree(tx, r.id())
		if err != nil || t == nil {
			return err
		}
		for id, n := range t.Nodes {
			idle = idle || (n.SealedByUs && !t.Sealed(id))
		}
		return nil
	}); err != nil || !idle {
		return err
	}
	mounts, err := overlay.ReadTable()
	if err != nil {
		return err
	}
	return s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		t, err := loadTree(tx, r.id())
		if err != nil || t == nil {
			return err
		}
		changed := false
		for id, n := range t.Nodes {
			if !n.SealedByUs || t.Sealed(id) {
				continue
			}
			if err := s.setSealed(ctx, mounts, s.branchUpper(r.id(), id), n, false); err != nil {
				return err
			}
			clearSeal(n)
			changed = true
		}
		if !changed {
			return nil
		}
		return storeTree(tx, r.id(), t)
	})
}

// removeBranchLayer detaches every host mount of a branch's layer and
// removes its directory. Failures are logged: Cleanup removes whatever a
// branch no longer owns.
func (s *Branches) removeBranchLayer(ctx context.Context, mounts overlay.Table, rootID, id string) {
	dir := s.branchDir(rootID, id)
	mounts.Detach(ctx, filepath.Join(dir, "fs"))
	s.discard(ctx, dir)
}
