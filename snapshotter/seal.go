package snapshotter

import (
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// ForkOption is an option of ForkFrom.
type ForkOption func(*forkOptions)

type forkOptions struct {
	parentFrozen bool
}

// WithParentFrozen says the caller froze every process of the parent
// before the fork: the seal is the caller's (branch.SealCaller), and the
// parent's rootfs is not remounted, so files its frozen processes hold
// open for writing do not stop the fork. The caller thaws them when the
// parent's last child ends.
func WithParentFrozen() ForkOption {
	return func(o *forkOptions) { o.parentFrozen = true }
}

// clearSeal forgets that n was sealed, and how.
func clearSeal(n *branch.Node) {
	n.SealedByUs, n.SealMode, n.SealedMounts = false, branch.SealSuperblock, nil
}

// sealEachMount seals branch id of r mount by mount: when its
// superblock's remount was refused, or was slow the last time (sealChoice).
// The mounts it will make read-only are recorded in the tree first, so
// that a crash midway leaves recovery knowing every one of them (setting a
// flag again, or clearing one that was never set, changes nothing). The
// caller holds the root's lock.
func (s *Branches) sealEachMount(ctx context.Context, r rootSnap, id, name string) error {
	start := time.Now()
	all, writable, err := overlay.WritableMounts(s.branchUpper(r.id(), id))
	if err != nil {
		return fmt.Errorf("find the mounts of %s: %w", name, err)
	}
	if err := s.recordSealMode(ctx, r, id, name, branch.SealMounts, overlay.SealedMounts(writable)); err != nil {
		return err
	}
	if err := overlay.SealEach(ctx, s.sealer, name, all, writable); err != nil {
		return err
	}
	overlay.LogSealed(ctx, name, writable, time.Since(start))
	return nil
}

// recordSealMode records in r's tree how branch id is sealed: the mode,
// and the mounts a per-mount seal makes read-only.
func (s *Branches) recordSealMode(ctx context.Context, r rootSnap, id, name, mode string, mounts []branch.SealedMount) error {
	if err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		t, err := loadTree(tx, r.id())
		if err != nil {
			return err
		}
		if t == nil || t.Nodes[id] == nil {
			return fmt.Errorf("%s left its tree", name)
		}
		n := t.Nodes[id]
		n.SealMode, n.SealedMounts = mode, mounts
		return storeTree(tx, r.id(), t)
	}); err != nil {
		return fmt.Errorf("record the seal of %s: %w", name, err)
	}
	return nil
}
