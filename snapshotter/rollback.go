//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/apply"
	"github.com/branchbox/branchbox/snapshotter/layer"
)

// Rollback: a branch's rootfs brought back to one of its checkpoints under
// its running processes, decided by a record and finished by recovery if
// interrupted.

// Rollback brings branch c's rootfs back to checkpoint name, through its
// live mount if it has one, so its running processes see it at once. It is
// refused while c has live children (their lowers are c's upper). The
// decision is recorded first; a crash after it is completed on restart.
func (s *Branches) Rollback(ctx context.Context, c branch.Ref, name string, opts ...branch.RollbackOpt) error {
	var o branch.RollbackOptions
	for _, opt := range opts {
		opt(&o)
	}
	r, id, unlock, err := s.lockBranch(ctx, c)
	if err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	defer unlock()
	resumed := false // an earlier call decided it: it may be half done
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		if _, err := tree.Get(id); err != nil {
			return err
		}
		if kids := tree.Children(id); len(kids) > 0 {
			return fmt.Errorf("it has %d live children (%s) built on its current state; commit or abort them first: %w", len(kids), strings.Join(kids, ", "), errdefs.ErrFailedPrecondition)
		}
		ck := d.Checkpoints[name]
		if ck == nil {
			return fmt.Errorf("no checkpoint named %q in %s: %w", name, branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		if ck.Branch != id {
			return fmt.Errorf("checkpoint %q is of branch %s, not of this one: %w", name, ck.Branch, errdefs.ErrInvalidArgument)
		}
		if ck.MemoryBytes > 0 && !o.Processes {
			return fmt.Errorf("checkpoint %q holds the branch's processes too, and its files alone would not match them: %w", name, errdefs.ErrFailedPrecondition)
		}
		if p, ok := d.Pending[id]; ok && p != name {
			return fmt.Errorf("a rollback to %q is under way; call rollback to %q again to complete it: %w", p, p, errdefs.ErrFailedPrecondition)
		}
		_, resumed = d.Pending[id]
		d.Pending[id] = name
		return storeCheckpoints(tx, r.id(), d)
	})
	if err != nil {
		return fmt.Errorf("rollback %s to %q: %w", c, name, err)
	}
	// As a commit's: the decision outlives a power loss before the branch
	// changes, so a half-done rollback is completed (branchdb.go).
	if err := s.bdb.Sync(); err != nil {
		return fmt.Errorf("rollback %s to %q (decided; calling rollback again completes it): sync branch metadata: %w", c, name, err)
	}
	s.fault(FaultRollbackDecided)
	// Decided: carried through even if the caller goes away (a shim
	// killed, a client that gave up), or the branch would stay pending,
	// its checkpoint undeletable, until a restart.
	if err := s.finishRollback(context.WithoutCancel(ctx), r, id, name); err != nil {
		var unmade *unmadeError
		if !resumed && errors.As(err, &unmade) {
			uerr := s.undecideRollback(ctx, r, id, name)
			if uerr == nil {
				return fmt.Errorf("rollback %s to %q, not made (nothing changed): %w", c, name, err)
			}
			log.G(ctx).WithError(uerr).WithField("branch", id).Warn("take back a rollback that changed nothing")
		}
		return fmt.Errorf("rollback %s to %q (decided; calling rollback again, or a restart, completes it): %w", c, name, err)
	}
	return nil
}

// unmadeError is a rollback that failed before it wrote anything to the
// branch: its decision can be taken back.
type unmadeError struct{ err error }

func (e *unmadeError) Error() string { return e.err.Error() }
func (e *unmadeError) Unwrap() error { return e.err }

// undecideRollback takes back the decision of a rollback of branch id to
// name that changed nothing, durably: a restart must not carry it out.
func (s *Branches) undecideRollback(ctx context.Context, r rootSnap, id, name string) error {
	if err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		d, err := loadCheckpoints(tx, r.id())
		if err != nil {
			return err
		}
		if d.Pending[id] != name {
			return fmt.Errorf("the rollback pending for branch %s is to %q, not %q: %w", id, d.Pending[id], name, errdefs.ErrAborted)
		}
		delete(d.Pending, id)
		return storeCheckpoints(tx, r.id(), d)
	}); err != nil {
		return err
	}
	return s.bdb.Sync()
}

// finishRollback carries a decided rollback through. It is idempotent:
// what differs from the checkpoint is found afresh each time.
func (s *Branches) finishRollback(ctx context.Context, r rootSnap, id, name string) error {
	var (
		tree *branch.Tree
		ck   *checkpointRecord
	)
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		t, d, err := s.loadBoth(tx, r)
		tree, ck = t, d.Checkpoints[name]
		return err
	}); err != nil {
		return err
	}
	if ck == nil {
		return fmt.Errorf("checkpoint %q is gone: %w", name, errdefs.ErrNotFound)
	}
	if err := s.withBranchTarget(ctx, r, tree, id, func(target string) error {
		return s.rollbackThrough(ctx, r, tree, id, ck, target, nil)
	}); err != nil {
		return err
	}
	s.fault(FaultRollbackApplied)
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		d, err := loadCheckpoints(tx, r.id())
		if err != nil {
			return err
		}
		delete(d.Pending, id)
		d.Heads[id] = name
		return storeCheckpoints(tx, r.id(), d)
	})
	if err != nil {
		return err
	}
	s.fault(FaultRollbackFinished)
	log.G(ctx).WithFields(log.Fields{"root": r.key, "branch": id, "checkpoint": name}).Info("rolled back")
	return nil
}

// withBranchTarget calls fn with a writable merged view of branch id:
// its live mount (made writable for the duration if a seal left it
// read-only), or a temporary mount.
func (s *Branches) withBranchTarget(ctx context.Context, r rootSnap, tree *branch.Tree, id string, fn func(target string) error) error {
	live, err := s.live.Find(s.branchUpper(r.id(), id))
	if err != nil {
		return err
	}
	if live.Target == "" {
		target := filepath.Join(s.root, "mnt", r.id()+"-"+id)
		if err := os.MkdirAll(target, 0o700); err != nil {
			return err
		}
		defer os.Remove(target)
		if err := s.ensureIDMapView(ctx, r); err != nil {
			return err
		}
		if err := mount.All(s.branchOverlay(r, tree, id, false), target); err != nil {
			return fmt.Errorf("mount branch %s: %w", id, err)
		}
		defer func() {
			if err := mount.UnmountAll(target, 0); err != nil {
				log.G(ctx).WithError(err).WithField("mount", target).Warn("unmount temporary mount")
			}
		}()
		return fn(target)
	}
	if live.Readonly {
		return fmt.Errorf("branch %s is mounted read-only at %s: %w", id, live.Target, errdefs.ErrFailedPrecondition)
	}
	return fn(live.Target)
}

// rollbackThrough makes target (a merged view of branch id) show
// checkpoint ck: the paths of the upper that changed since ck are written
// as ck has them into a scratch layer, applied to target. j, if not nil,
// records what that changes in the branch's upper.
func (s *Branches) rollbackThrough(ctx context.Context, r rootSnap, tree *branch.Tree, id string, ck *checkpointRecord, target string, j *apply.Journal) (retErr error) {
	m, err := s.manifests.load(filepath.Join(s.checkpointDir(r.id(), ck.Seq), "manifest"))
	if err != nil {
		return err
	}
	if err := s.ensureIDMapView(ctx, r); err != nil {
		return err
	}
	changes, _, err := layer.Diff(ctx, s.branchUpper(r.id(), id), m)
	if err != nil {
		return fmt.Errorf("find changes since checkpoint %q: %w", ck.Name, err)
	}
	if len(changes) == 0 {
		return nil
	}
	// The checkpoint's state, read-only: its layers over the branch's lowers.
	state := filepath.Join(s.root, "mnt", "ck-"+r.id()+"-"+strconv.FormatUint(ck.Seq, 10))
	lowers := make([]string, 0, len(ck.Chain)+8)
	for _, seq := range ck.Chain {
		lowers = append(lowers, filepath.Join(s.checkpointDir(r.id(), seq), "fs"))
	}
	lowers = append(lowers, s.lowerDirs(r, tree, id)...)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return err
	}
	defer os.Remove(state)
	opts := append([]string{"ro", "lowerdir=" + strings.Join(lowers, ":")}, s.options...)
	if err := mount.All([]mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}, state); err != nil {
		return fmt.Errorf("mount checkpoint %q: %w", ck.Name, err)
	}
	defer func() {
		if err := mount.UnmountAll(state, 0); err != nil && retErr == nil {
			retErr = fmt.Errorf("unmount checkpoint %q: %w", ck.Name, err)
		}
	}()
	scratch := filepath.Join(s.checkpointBase(r.id()), "rb-"+id)
	os.RemoveAll(scratch)
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	// Until the apply below, the branch is untouched: a failure is
	// unmade, and a rollback of its own (j == nil) is taken back.
	if _, err := layer.Write(ctx, layer.Source{Root: state, Merged: true}, changes, scratch); err != nil {
		return &unmadeError{fmt.Errorf("gather checkpoint %q's version of %d changed paths: %w", ck.Name, len(changes),
			s.noRoom(err, "them", "or roll back to another checkpoint"))}
	}
	if j == nil {
		// As a commit is refused (commitcheck.go): the apply's needs
		// against the space left beside the scratch layer.
		needs, err := apply.Measure(ctx, scratch, append([]string{s.branchUpper(r.id(), id)}, s.lowerDirs(r, tree, id)...))
		if err != nil {
			return &unmadeError{fmt.Errorf("checkpoint %q's version of %d changed paths cannot be applied: %w", ck.Name, len(changes), err)}
		}
		if err := s.checkRoom(ctx, needs, fmt.Sprintf("the apply of checkpoint %q's version of %d changed paths", ck.Name, len(changes)), "or roll back to another checkpoint"); err != nil {
			return &unmadeError{err}
		}
	}
	// resume: a killed apply's temporaries in target are removed.
	if err := applyLayer(ctx, scratch, target, "", true, j); err != nil {
		return fmt.Errorf("apply checkpoint %q through %s: %w", ck.Name, target, err)
	}
	return nil
}

// rollbackForCommit: a branch forked from a checkpoint replaces its
// parent's state, so the parent (at target) is first brought back to that
// checkpoint; the branch's upper is then applied over it.
func (s *Branches) rollbackForCommit(ctx context.Context, r rootSnap, tree *branch.Tree, n *branch.Node, target string, j *apply.Journal) error {
	if n.FromCheckpoint == "" {
		return nil
	}
	var ck *checkpointRecord
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		d, err := loadCheckpoints(tx, r.id())
		if err == nil {
			ck = d.Checkpoints[n.FromCheckpoint]
		}
		return err
	}); err != nil {
		return err
	}
	if ck == nil {
		return fmt.Errorf("checkpoint %q that branch %s was forked from is gone: %w", n.FromCheckpoint, n.ID, errdefs.ErrDataLoss)
	}
	if err := s.rollbackThrough(ctx, r, tree, n.Parent, ck, target, j); err != nil {
		return fmt.Errorf("bring the parent back to checkpoint %q before committing branch %s: %w", ck.Name, n.ID, err)
	}
	return nil
}

// copyDirAttrs gives directory dst the owner, mode and times of src.
func copyDirAttrs(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("stat %s: %w", src, err)
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := os.Chmod(dst, os.FileMode(st.Mode&0o777)|unixModeBits(st.Mode)); err != nil {
		return err
	}
	return os.Chtimes(dst, time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix()))
}

// unixModeBits turns setuid, setgid and sticky bits into os.FileMode's.
func unixModeBits(m uint32) os.FileMode {
	var out os.FileMode
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	return out
}
