//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Fork: children over a branch's state (or a checkpoint's), and the seal of
// the parent.

// Fork makes count children of the branch c over its current state and
// seals c (its live mounts become read-only) until its last child ends.
func (s *Branches) Fork(ctx context.Context, c branch.Ref, count int) ([]branch.Info, error) {
	return s.ForkFrom(ctx, c, count, "")
}

// ForkFrom is Fork; with a checkpoint named (one of c's own), the children
// start from that checkpoint's state instead of c's current one, and
// committing one replaces c's state with the child's.
func (s *Branches) ForkFrom(ctx context.Context, c branch.Ref, count int, from string, opts ...ForkOption) (_ []branch.Info, retErr error) {
	f := &fork{c: c, count: count, from: from}
	for _, opt := range opts {
		opt(&f.opts)
	}
	if count < 1 || count > 1024 {
		return nil, fmt.Errorf("fork: count must be between 1 and 1024, got %d: %w", count, errdefs.ErrInvalidArgument)
	}
	// Resolve first, unlocked, to learn which root to lock.
	if err := s.withTx(ctx, false, func(ctx context.Context, _ *bolt.Tx) (err error) {
		f.r, f.parent, err = s.resolve(ctx, c)
		return err
	}); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	if err := s.usable(f.r); err != nil {
		return nil, fmt.Errorf("fork %s: %w", c, err)
	}
	defer s.locks.lock(f.r.id())()
	f.parentUpper = s.branchUpper(f.r.id(), f.parent)
	var err error
	if f.live, err = s.live.Find(f.parentUpper); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}

	defer func() {
		if retErr != nil {
			for _, d := range f.created {
				if err := os.RemoveAll(d); err != nil {
					log.G(ctx).WithError(err).WithField("path", d).Warn("remove directory of failed fork; Cleanup will retry")
				}
			}
		}
	}()
	if err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		return s.recordFork(ctx, tx, f)
	}); err != nil {
		return nil, fmt.Errorf("fork %s: %w", c, s.noRoom(err, "the new branches' layers", "or abort branches"))
	}
	f.created = nil
	s.fault(FaultForkCommitted)

	if err := s.sealForked(ctx, f); err != nil {
		return nil, err
	}
	out := make([]branch.Info, len(f.kids))
	for i, id := range f.kids {
		out[i] = branch.Info{Node: *f.tree.Nodes[id], Mounts: s.branchOverlay(f.r, f.tree, id, false)}
	}
	log.G(ctx).WithFields(log.Fields{"root": f.r.key, "parent": f.parent, "children": f.kids}).Info("forked")
	return out, nil
}

// fork is one ForkFrom under way.
type fork struct {
	c     branch.Ref
	count int
	from  string // the checkpoint forked from, if any
	opts  forkOptions

	r           rootSnap
	parent      string
	parentUpper string
	live        overlay.Live // the parent's live mount, read before the fork
	tree        *branch.Tree
	kids        []string
	created     []string // branch directories made, removed if the fork fails
	// wasSealed: the parent had live children already, and is sealed.
	wasSealed bool
}

// recordFork adds f's children to the tree in tx and makes their
// directories: the fork becomes real when tx commits.
func (s *Branches) recordFork(ctx context.Context, tx *bolt.Tx, f *fork) (err error) {
	if f.r, f.parent, err = s.resolve(ctx, f.c); err != nil {
		return err
	}
	if f.tree, err = loadTree(tx, f.r.id()); err != nil {
		return err
	}
	if f.tree == nil {
		f.tree = branch.NewTree(f.r.key, time.Now())
	}
	tree, parent := f.tree, f.parent
	if tree.Depth(parent) >= maxDepth {
		return fmt.Errorf("%s is %d levels deep, the most this snapshotter stacks: %w", f.c, tree.Depth(parent), errdefs.ErrFailedPrecondition)
	}
	f.wasSealed = tree.Sealed(parent)
	if f.kids, err = tree.Fork(parent, f.count, time.Now()); err != nil {
		return err
	}
	if f.from != "" {
		if err := forkFromCheckpoint(tx, f); err != nil {
			return err
		}
	}
	// The last child's id is the longest of them.
	opts := s.branchOverlay(f.r, tree, f.kids[len(f.kids)-1], false)[0].Options
	if size := overlay.MountDataSize(opts); size > os.Getpagesize() {
		return fmt.Errorf("it is %d levels deep, and its branches' overlay mount would stack %d layers, whose options (%d bytes) are more than the kernel takes in one mount (%d): fork a branch less deep: %w",
			tree.Depth(parent), len(s.lowerDirs(f.r, tree, f.kids[0]))+1, size, os.Getpagesize(), errdefs.ErrResourceExhausted)
	}
	if err := s.makeForkDirs(ctx, f); err != nil {
		return err
	}
	s.fault(FaultForkDirs)
	// Only a mount that was writable is ours to seal and later unseal: a
	// read-only rootfs stays read-only.
	if f.live.Target != "" && !f.live.Readonly && !f.wasSealed {
		p := tree.Nodes[parent]
		p.SealedByUs, p.SealMode, p.SealedMounts = true, branch.SealSuperblock, nil
		if f.opts.parentFrozen {
			p.SealMode = branch.SealCaller
		}
	}
	return storeTree(tx, f.r.id(), tree)
}

// forkFromCheckpoint stacks f's children on the checkpoint f.from, which
// must be one of the forked branch's own.
func forkFromCheckpoint(tx *bolt.Tx, f *fork) error {
	d, err := loadCheckpoints(tx, f.r.id())
	if err != nil {
		return err
	}
	ck := d.Checkpoints[f.from]
	if ck == nil {
		return fmt.Errorf("no checkpoint named %q in %s: %w", f.from, branch.DisplayKey(f.r.key), errdefs.ErrNotFound)
	}
	if ck.Branch != f.parent {
		return fmt.Errorf("checkpoint %q is of branch %s, not of the one forked (%s); fork that branch: %w", f.from, ck.Branch, f.parent, errdefs.ErrInvalidArgument)
	}
	for _, id := range f.kids {
		f.tree.Nodes[id].FromCheckpoint = f.from
		f.tree.Nodes[id].CheckpointLayers = append([]uint64(nil), ck.Chain...)
	}
	return nil
}

// makeForkDirs makes the directories of f's children, owned as the
// parent's upper is, recording each in f.created.
func (s *Branches) makeForkDirs(ctx context.Context, f *fork) error {
	// The children's mounts name the id-mapped view; made inside the
	// transaction, which keeps the reaper (that would take a root
	// without a tree for an orphan) out until the tree is stored.
	if err := s.ensureIDMapView(ctx, f.r); err != nil {
		return err
	}
	uid, gid, err := ownerOf(f.parentUpper)
	if err != nil {
		return err
	}
	for _, id := range f.kids {
		dir := s.branchDir(f.r.id(), id)
		f.created = append(f.created, dir)
		if err := makeBranchDir(dir, uid, gid); err != nil {
			return err
		}
	}
	if f.from != "" {
		// The root of the merged view shows the upper's own root: give
		// it the checkpoint's.
		top := filepath.Join(s.checkpointDir(f.r.id(), f.tree.Nodes[f.kids[0]].CheckpointLayers[0]), "fs")
		for _, id := range f.kids {
			if err := copyDirAttrs(top, s.branchUpper(f.r.id(), id)); err != nil {
				return err
			}
		}
	}
	return nil
}

// sealForked seals the parent of a recorded fork if the fork made it ours
// to seal: its superblock, else (a file unlinked while open, or a
// superblock seal that was slow: sealChoice) each of its mounts. If the
// seal fails the children are aborted, as if they had never been.
func (s *Branches) sealForked(ctx context.Context, f *fork) error {
	p := f.tree.Nodes[f.parent]
	if !p.SealedByUs || f.wasSealed || p.SealMode != branch.SealSuperblock {
		return nil
	}
	if err := s.sealParent(ctx, f); err != nil {
		// Undo: the children never existed for anyone.
		if uerr := s.abortAll(ctx, f.r, f.kids); uerr != nil {
			log.G(ctx).WithError(uerr).Warn("undo fork after failed seal")
		}
		return fmt.Errorf("fork %s: seal the parent: %w", f.c, err)
	}
	return nil
}

// sealParent seals the parent of fork f, recorded with a superblock seal,
// the way sealChoice says, and tells it what that cost.
func (s *Branches) sealParent(ctx context.Context, f *fork) error {
	name := f.c.String()
	if s.choice.eachMount(f.parentUpper) {
		start := time.Now()
		err := s.sealEachMount(ctx, f.r, f.parent, name)
		if err == nil || errors.As(err, new(*branch.WritersError)) {
			// Writers would refuse the superblock's remount too.
			s.choice.eachMountTook(f.parentUpper, time.Since(start))
			if err == nil {
				s.writeBackSoon(ctx, f.parentUpper)
			}
			return err
		}
		// Something else failed (a namespace entered, a mount moved
		// meanwhile): the superblock's remount does not depend on those.
		log.G(ctx).WithError(err).WithField("branch", name).Warn("seal mount by mount failed; sealing the superblock")
		s.choice.forget(f.parentUpper)
		if err := s.recordSealMode(ctx, f.r, f.parent, name, branch.SealSuperblock, nil); err != nil {
			return err
		}
	}
	start := time.Now()
	err := s.sealSuperblock(ctx, f.r.id(), f.live)
	if err == nil {
		s.choice.superblockTook(f.parentUpper, time.Since(start))
	}
	if errors.Is(err, overlay.ErrSuperblockBusy) {
		err = s.sealEachMount(ctx, f.r, f.parent, name)
	}
	return err
}

// writeBackSoon starts writing back, in the background, the filesystem
// of a parent sealed mount by mount. A superblock seal's remount writes
// back what the parent had written (its sync, which goes on after the
// fork returns); a per-mount seal does not, and the write-back was left
// to the next unmount of an overlay on that filesystem: the unmount of a
// branch's rootfs at its abort or commit syncs the whole filesystem of
// its upper. An abort right after a fork of a parent that had written 16
// MB waited 9-13 ms for it, against 3 ms after a superblock seal.
func (s *Branches) writeBackSoon(ctx context.Context, upper string) {
	ctx = context.WithoutCancel(ctx)
	s.sealWG.Add(1)
	go func() {
		defer s.sealWG.Done()
		fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Syncfs(fd)
			unix.Close(fd)
		}
		if err != nil {
			log.G(ctx).WithError(err).WithField("upper", upper).Debug("write back a sealed parent's filesystem")
		}
	}()
}

// sealSuperblock makes the superblock of the overlay mounted at live
// read-only (overlay.SealThreads.Seal). The caller holds the lock of root
// id; the remount's sync may go on after it returns, and the root's lock is
// not taken again (nor is the tree remounted) before it ends.
func (s *Branches) sealSuperblock(ctx context.Context, id string, live overlay.Live) error {
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
