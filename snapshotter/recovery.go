//go:build linux

package snapshotter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Recovery at start: decided operations of every branch tree finished or
// undone, seals restored, orphans and temporary mounts removed. Checkpoints'
// recovery (checkpoints.go) runs from here too.

// recoverBranches finishes what a crash interrupted: commits that were
// decided are carried through, and every sealed branch is made to match
// its children again. Orphaned layers go with Cleanup. A tree whose
// recovery fails is quarantined (quarantine.go), not the daemon's end.
func (s *Branches) recoverBranches(ctx context.Context) error {
	var (
		trees map[string]*branch.Tree
		bad   map[string]error
	)
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		trees, bad, err = allTrees(tx)
		return err
	}); err != nil {
		return err
	}
	for rootID, err := range bad {
		s.quarantineTree(ctx, rootID, "snapshot "+rootID, err)
	}
	for rootID, t := range trees {
		if err := s.recoverTree(ctx, rootID, t); err != nil {
			s.quarantineTree(ctx, rootID, t.Root, err)
		}
	}
	return nil
}

// recoverTree completes the commits of tree t (of root snapshot rootID)
// that were decided, and reseals its branches; a tree whose root snapshot
// is gone is deleted.
func (s *Branches) recoverTree(ctx context.Context, rootID string, t *branch.Tree) error {
	var r rootSnap
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		r, _, err = s.resolve(ctx, branch.Ref{Root: branch.Root{Key: t.Root}})
		return err
	})
	if (err != nil && errdefs.IsNotFound(err)) || (err == nil && r.id() != rootID) {
		log.G(ctx).WithError(err).WithField("root", t.Root).Warn("branch tree without its root snapshot; removing it")
		return s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error { return deleteTree(tx, rootID) })
	}
	if err != nil {
		return fmt.Errorf("find root snapshot %q: %w", t.Root, err)
	}
	defer s.locks.lock(r.id())()
	for _, id := range t.Committing() {
		log.G(ctx).WithFields(log.Fields{"root": t.Root, "branch": id}).Info("completing a commit interrupted by a crash")
		if _, err := s.finishCommit(ctx, r, id, true, nil, nil); err != nil {
			return fmt.Errorf("complete the commit of branch %s: %w", id, err)
		}
	}
	if err := s.resealAll(ctx, r); err != nil {
		return fmt.Errorf("reseal its branches: %w", err)
	}
	return nil
}

// resealAll makes every branch of r that a fork sealed match its
// children again: read-only while it has some, writable once it has none.
func (s *Branches) resealAll(ctx context.Context, r rootSnap) error {
	var t *branch.Tree
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		t, err = loadTree(tx, r.id())
		return err
	}); err != nil || t == nil {
		return err
	}
	mounts, err := overlay.ReadTable()
	if err != nil {
		return err
	}
	for id, n := range t.Nodes {
		if n.SealedByUs && t.Sealed(id) {
			err := s.setSealed(ctx, mounts, s.branchUpper(r.id(), id), n, true)
			if errors.Is(err, overlay.ErrSuperblockBusy) {
				err = s.sealEachMount(ctx, r, id, branchName(id)+" of "+t.Root)
			}
			if err != nil && refusedByWriters(err) {
				err = s.undoUnheldFork(ctx, r, t, id, err)
			}
			if err != nil {
				return err
			}
		}
	}
	return s.unsealIdle(ctx, r)
}

// refusedByWriters says whether a seal failed because files of the
// rootfs are open for writing.
func refusedByWriters(err error) bool {
	return errors.As(err, new(*branch.WritersError)) || errors.Is(err, unix.EBUSY)
}

// undoUnheldFork discards the children of branch id, whose seal writers
// refused at recovery, as the fork's own undo would have. A sealed mount
// takes no new writer, so writers now mean that the seal never held: the
// fork that made the children was cut short between its record and its
// seal (the snapshotter killed), and never answered, so nobody was given
// them. Only children that hold nothing are discarded (no children of
// their own, an empty upper); otherwise the tree stays quarantined with
// cause, nothing lost.
func (s *Branches) undoUnheldFork(ctx context.Context, r rootSnap, t *branch.Tree, id string, cause error) error {
	kids := t.Children(id)
	for _, k := range kids {
		if len(t.Children(k)) > 0 {
			return cause
		}
		if empty, err := emptyDir(s.branchUpper(r.id(), k)); err != nil || !empty {
			return cause
		}
	}
	// Whatever flags a per-mount seal cut short had set go first; the
	// record goes with the children. A crash in between finds the same
	// state again.
	mounts, err := overlay.ReadTable()
	if err != nil {
		return err
	}
	if err := s.setSealed(ctx, mounts, s.branchUpper(r.id(), id), t.Nodes[id], false); err != nil {
		return fmt.Errorf("unseal %s after a seal cut short: %w", branchName(id), err)
	}
	log.G(ctx).WithError(cause).WithFields(log.Fields{"root": t.Root, "branch": branchName(id), "discarded": kids}).
		Warn("a fork's seal was cut short by a crash and never held: its branches, never handed out, are discarded")
	return s.abortAll(ctx, r, kids)
}

// emptyDir says whether dir has no entries.
func emptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil {
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		return false, err
	}
	return false, nil
}

// orphanBranchDirectories lists branch layers that no tree owns, and
// temporary commit mounts left by a crash.
func (s *Branches) orphanBranchDirectories(ctx context.Context, tx *bolt.Tx, ids map[string]string) ([]string, error) {
	trees, bad, err := allTrees(tx)
	if err != nil {
		return nil, err
	}
	var orphans []string
	base := filepath.Join(s.root, "branches")
	roots, err := os.ReadDir(base)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, rd := range roots {
		if bad[rd.Name()] != nil {
			continue // quarantined: its layers are all there is to recover it from
		}
		t, ok := trees[rd.Name()]
		if _, live := ids[rd.Name()]; !ok || !live {
			orphans = append(orphans, filepath.Join(base, rd.Name()))
			continue
		}
		layered := map[string]bool{}
		for _, id := range t.Layered() {
			layered[id] = true
		}
		entries, err := os.ReadDir(filepath.Join(base, rd.Name()))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if !layered[e.Name()] && e.Name() != idmapViewName {
				orphans = append(orphans, filepath.Join(base, rd.Name(), e.Name()))
			}
		}
	}
	for _, o := range orphans {
		overlay.DetachUnder(ctx, o)
	}
	return orphans, nil
}

// cleanTempMounts unmounts and removes the temporary commit mounts a crash
// left behind. Only at start: while serving, a commit may be using one.
func (s *Branches) cleanTempMounts(ctx context.Context) error {
	mnt := filepath.Join(s.root, "mnt")
	entries, err := os.ReadDir(mnt)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(mnt, e.Name())
		if err := mount.UnmountAll(p, 0); err != nil {
			return fmt.Errorf("unmount leftover commit mount %s: %w", p, err)
		}
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		log.G(ctx).WithField("path", p).Info("removed leftover commit mount")
	}
	return nil
}

// recoverCheckpoints completes the rollbacks a crash interrupted.
func (s *Branches) recoverCheckpoints(ctx context.Context) error {
	todo, err := s.pendingRollbacks(ctx, "")
	if err != nil {
		return err
	}
	for _, p := range todo {
		if s.quarantined.cause(p.rootID) != nil {
			continue // retried with the rest of its tree
		}
		if err := s.finishPendingRollback(ctx, p); err != nil {
			s.quarantineTree(ctx, p.rootID, "snapshot "+p.rootID, err)
		}
	}
	return nil
}

// pendingRollback is a rollback that was decided and not finished.
type pendingRollback struct{ rootID, branchID, name string }

// pendingRollbacks lists the unfinished rollbacks of root snapshot rootID,
// or of every root if rootID is "". A root whose checkpoint record cannot
// be decoded is quarantined.
func (s *Branches) pendingRollbacks(ctx context.Context, rootID string) ([]pendingRollback, error) {
	var todo []pendingRollback
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		b := nestedBucket(tx, bucketBranchbox, bucketCheckpoints)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if rootID != "" && string(k) != rootID {
				return nil
			}
			var d checkpointDoc
			if err := json.Unmarshal(v, &d); err != nil {
				err = fmt.Errorf("decode checkpoints of snapshot %s: %v: %w", k, err, errdefs.ErrDataLoss)
				if rootID != "" {
					return err
				}
				s.quarantineTree(ctx, string(k), "snapshot "+string(k), err)
				return nil
			}
			for id, name := range d.Pending {
				todo = append(todo, pendingRollback{string(k), id, name})
			}
			return nil
		})
	})
	return todo, err
}

// finishPendingRollback completes a rollback a crash interrupted.
func (s *Branches) finishPendingRollback(ctx context.Context, p pendingRollback) error {
	var r rootSnap
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		ids, err := storage.IDMap(ctx)
		if err != nil {
			return err
		}
		key, ok := ids[p.rootID]
		if !ok {
			return fmt.Errorf("snapshot %s: %w", p.rootID, errdefs.ErrNotFound)
		}
		r, _, err = s.resolve(ctx, branch.Ref{Root: branch.Root{Key: key}})
		return err
	})
	if err != nil {
		log.G(ctx).WithError(err).WithField("snapshot", p.rootID).Warn("rollback pending for a snapshot that is gone")
		return nil
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "branch": p.branchID, "checkpoint": p.name}).Info("completing a rollback interrupted by a crash")
	unlock := s.locks.lock(r.id())
	err = s.finishRollback(ctx, r, p.branchID, p.name)
	unlock()
	if err != nil {
		return fmt.Errorf("complete the rollback of branch %s to %q: %w", p.branchID, p.name, err)
	}
	return nil
}

// orphanCheckpointDirectories lists checkpoint layers no record owns. The
// temporaries of operations in flight (new-*, rb-*) are left alone; the
// start of the daemon removes them (removeCheckpointTemps).
func (s *Branches) orphanCheckpointDirectories(tx *bolt.Tx, ids map[string]string) ([]string, error) {
	base := filepath.Join(s.root, "checkpoints")
	roots, err := os.ReadDir(base)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var orphans []string
	for _, rd := range roots {
		if _, live := ids[rd.Name()]; !live {
			orphans = append(orphans, filepath.Join(base, rd.Name()))
			continue
		}
		more, err := s.orphanCheckpointsOf(tx, rd.Name())
		if err != nil {
			return nil, err
		}
		orphans = append(orphans, more...)
	}
	return orphans, nil
}

func (s *Branches) orphanCheckpointsOf(tx *bolt.Tx, rootID string) ([]string, error) {
	d, err := loadCheckpoints(tx, rootID)
	if err != nil {
		return nil, err
	}
	// Every layer a record's chain stacks is owned, deleted records' too.
	owned := map[string]bool{}
	own := func(c *checkpointRecord) {
		owned[strconv.FormatUint(c.Seq, 10)] = true
		for _, seq := range c.Chain {
			owned[strconv.FormatUint(seq, 10)] = true
		}
	}
	for _, c := range d.Checkpoints {
		own(c)
	}
	for _, c := range d.Deleted {
		own(c)
	}
	entries, err := os.ReadDir(s.checkpointBase(rootID))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !owned[e.Name()] && !strings.HasPrefix(e.Name(), "new-") && !strings.HasPrefix(e.Name(), "rb-") && !unrecorded(e.Name(), d) {
			out = append(out, filepath.Join(s.checkpointBase(rootID), e.Name()))
		}
	}
	return out, nil
}

// unrecorded says whether the checkpoint layer name has a number no record
// took yet: one in flight, renamed into place and being synced before its
// record is written (Checkpoint), which a reaper running meanwhile (the
// removal of another snapshot, containerd's Cleanup) removed before
// 2026-12-07, leaving the checkpoint recorded without its layer. At start
// none is in flight, and removeCheckpointTemps removes what a crash left.
func unrecorded(name string, d *checkpointDoc) bool {
	seq, err := strconv.ParseUint(name, 10, 64)
	return err == nil && seq >= d.Next
}

// removeCheckpointOrphans removes the layers of checkpoints whose branch
// ended. Called with the root's lock held, so no checkpoint is in flight.
func (s *Branches) removeCheckpointOrphans(ctx context.Context, rootID string) {
	// A root that never had a checkpoint has nothing to look up.
	if _, err := os.Lstat(s.checkpointBase(rootID)); os.IsNotExist(err) {
		return
	}
	var dirs []string
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		dirs, err = s.orphanCheckpointsOf(tx, rootID)
		return err
	}); err != nil {
		log.G(ctx).WithError(err).Warn("find checkpoints of ended branches; Cleanup will retry")
		return
	}
	s.removeAll(ctx, dirs)
}

// removeCheckpointTemps removes, at start only, what checkpoints and
// rollbacks cut short left: their temporaries, and layers renamed into
// place whose record was never written (unrecorded).
func (s *Branches) removeCheckpointTemps(ctx context.Context) error {
	tmps, err := filepath.Glob(filepath.Join(s.root, "checkpoints", "*", "new-*"))
	if err != nil {
		return err
	}
	rbs, err := filepath.Glob(filepath.Join(s.root, "checkpoints", "*", "rb-*"))
	if err != nil {
		return err
	}
	layers, err := filepath.Glob(filepath.Join(s.root, "checkpoints", "*", "[0-9]*"))
	if err != nil {
		return err
	}
	var cut []string
	if len(layers) > 0 {
		err = s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
			docs := map[string]*checkpointDoc{}
			for _, l := range layers {
				rootID := filepath.Base(filepath.Dir(l))
				d, ok := docs[rootID]
				if !ok {
					if d, err = loadCheckpoints(tx, rootID); err != nil {
						return err
					}
					docs[rootID] = d
				}
				if unrecorded(filepath.Base(l), d) {
					cut = append(cut, l)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	s.removeAll(ctx, append(append(tmps, rbs...), cut...))
	return nil
}
