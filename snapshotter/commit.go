//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/apply"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Commit: first commit wins; checked, decided by a synced record, applied
// through the parent's live mount (docs/commit.md).

// CommitBranch makes branch c's changes its parent's. The first commit
// into a parent wins: every sibling and its descendants become stale and
// their layers are discarded. A parent that is mounted is changed through
// its mount, so its running processes see the commit at once; one that is
// not is mounted for the commit and unmounted after.
//
// What can be known before the decision is checked first (checkCommit): a
// commit that cannot apply is refused with nothing changed. The decision
// is one metadata transaction; from then on the commit is carried through
// whatever the caller does: a caller whose context ends gets an error, the
// commit goes on, and a later call sees its result. Should the apply still
// fail, the parent is put back as it was (commitundo.go) and the branch
// stays committing: calling commit again applies it anew, aborting it
// abandons it. A crash after the decision is completed by recovery.
func (s *Branches) CommitBranch(ctx context.Context, c branch.Ref) (CommitResult, error) {
	for attempt := 0; ; attempt++ {
		res, err := s.commitBranch(ctx, c)
		// The branch became a live leaf after the check was skipped, or its
		// parent moved on: check again.
		if errors.Is(err, errCheckAgain) {
			if attempt < 3 {
				continue
			}
			return res, fmt.Errorf("commit %s: the branch kept changing while it was checked; try again: %w", c, errdefs.ErrAborted)
		}
		return res, err
	}
}

// errCheckAgain says the pre-decision check no longer holds.
var errCheckAgain = errors.New("the branch changed since it was checked")

// checked is what the pre-decision check saw, and its refusal if it
// refused: it holds while the branch is still a live leaf of the same
// parent at the same epoch.
type checked struct {
	parent string
	epoch  uint64
	err    error
}

func (s *Branches) commitBranch(ctx context.Context, c branch.Ref) (CommitResult, error) {
	var d commitDecision
	// Unlocked: which root to lock, and the check of a live leaf (it reads
	// only what cannot change while the branch is a live leaf; the
	// decision checks that it still is, before it takes a refusal: a
	// sibling's commit may have removed the branch meanwhile).
	done, check, err := s.commitPrecheck(ctx, c, &d.r, &d.id)
	if err != nil {
		return CommitResult{}, err
	}
	if done != nil {
		return *done, nil
	}
	if err := ctx.Err(); err != nil && (check == nil || check.err == nil) {
		return CommitResult{}, fmt.Errorf("commit %s (not decided, nothing changed): %w", c, err)
	}
	if err := s.retryQuarantinedCommit(ctx, c, d.r); err != nil {
		return CommitResult{}, err
	}
	// A fork's seal still syncing is waited for only once the decision is
	// made: the decision's own sync overlaps it.
	unlock, awaitSeal := s.locks.lockBeforeSeal(d.r.id())
	handedOff := false
	defer func() {
		if !handedOff {
			unlock()
		}
	}()
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		return s.decideCommit(ctx, tx, c, check, &d)
	})
	if errors.Is(err, errCheckAgain) || (check != nil && err == check.err && err != nil) {
		return CommitResult{}, err
	}
	if err != nil {
		return CommitResult{}, fmt.Errorf("commit %s: %w", c, err)
	}
	if d.done != nil {
		return *d.done, nil
	}
	if d.decided != nil {
		// Kept past its transaction: nothing below asks it about ended nodes.
		d.decided.SetTombstones(nil)
	}
	handedOff = true
	return s.carryOutDecided(ctx, c, d, unlock, awaitSeal)
}

// commitDecision is what the decision of a commit found or decided.
type commitDecision struct {
	r       rootSnap
	id      string
	plan    branch.CommitPlan
	resume  bool          // decided before, not finished: carried out again
	decided *branch.Tree  // the tree as decided
	done    *CommitResult // committed already (by a call this one waited for)
}

// retryQuarantinedCommit retries the recovery of a quarantined root: a
// commit the recovery could not complete is retried here, as its error
// said it would be. If it recovers the commit is checked again
// (errCheckAgain), so that a completed commit answers with its result.
func (s *Branches) retryQuarantinedCommit(ctx context.Context, c branch.Ref, r rootSnap) error {
	if s.quarantined.cause(r.id()) == nil {
		return nil
	}
	if _, err := s.recoverRoot(ctx, r.id()); err == nil {
		s.quarantined.lift(r.id())
		return errCheckAgain
	} else {
		s.quarantined.add(r.id(), err)
	}
	if err := s.usable(r); err != nil {
		return fmt.Errorf("commit %s: %w", c, err)
	}
	return nil
}

// decideCommit decides, in tx, the commit of c: first commit wins. It
// resumes a commit decided before, answers one committed meanwhile, and
// takes the pre-decision check's refusal only while that check still
// holds.
func (s *Branches) decideCommit(ctx context.Context, tx *bolt.Tx, c branch.Ref, check *checked, d *commitDecision) (err error) {
	if d.r, d.id, err = s.resolve(ctx, c); err != nil {
		return err
	}
	r, id := d.r, d.id
	tree, err := loadTree(tx, r.id())
	if err != nil {
		return err
	}
	if tree == nil {
		tree = branch.NewTree(r.key, time.Now())
	}
	// Committed meanwhile (by a call this one waited for).
	if n, ok := tree.Ended(id); ok && n.State == branch.Committed {
		d.done, err = s.committedResult(ctx, tx, r, tree, n)
		return err
	}
	// A commit that was decided but failed to finish is resumed.
	n := tree.Nodes[id]
	if n != nil && n.State == branch.Committing {
		d.resume = true
		d.plan = branch.CommitPlan{Winner: id, Parent: n.Parent, Epoch: n.WinnerEpoch}
		return nil
	}
	if n != nil && n.State == branch.Live {
		if p := tree.Nodes[n.Parent]; p != nil && len(tree.Children(id)) == 0 {
			if check == nil || check.parent != p.ID || check.epoch != p.Epoch {
				return errCheckAgain
			}
			if check.err != nil {
				return check.err
			}
		}
	}
	if d.plan, err = tree.BeginCommit(id, time.Now()); err != nil {
		return err
	}
	if err := storeTree(tx, r.id(), tree); err != nil {
		return err
	}
	d.decided = tree
	return nil
}

// carryOutDecided carries a decided commit through on a branch the
// caller cannot end, holding the root's lock (unlock releases it) until
// done. A caller that goes away first is told the commit goes on.
func (s *Branches) carryOutDecided(ctx context.Context, c branch.Ref, d commitDecision, unlock func(), awaitSeal func()) (CommitResult, error) {
	type outcome struct {
		res CommitResult
		err error
	}
	out := make(chan outcome, 1)
	s.commitWG.Add(1)
	go func() {
		defer s.commitWG.Done()
		defer unlock()
		res, err := s.carryOutCommit(context.WithoutCancel(ctx), c, d.r, d.plan, d.resume, d.decided, awaitSeal)
		if err != nil && ctx.Err() != nil {
			// Its caller went away: the log is the only one told.
			log.G(ctx).WithError(err).WithFields(log.Fields{"root": d.r.key, "branch": d.plan.Winner}).Warn("decided commit failed after its caller went away")
		}
		out <- outcome{res, err}
	}()
	select {
	case o := <-out:
		return o.res, o.err
	case <-ctx.Done():
		return CommitResult{}, fmt.Errorf("commit %s: decided (it won at epoch %d) and being applied; that goes on without this caller: call commit again to see its result: %w", c, d.plan.Epoch, ctx.Err())
	}
}

// commitPrecheck resolves c and runs, before the decision, the checks of
// checkCommit on a live leaf branch, returning what it checked. For a
// branch that was committed already it returns that commit's result
// instead. Anything else (a stale or committing branch, one with children)
// is left to the decision to answer.
func (s *Branches) commitPrecheck(ctx context.Context, c branch.Ref, r *rootSnap, id *string) (*CommitResult, *checked, error) {
	var (
		tree  *branch.Tree
		node  *branch.Node
		seen  checked
		ended *CommitResult
	)
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if *r, *id, err = s.resolve(ctx, c); err != nil {
			return err
		}
		if tree, err = loadTree(tx, r.id()); err != nil || tree == nil {
			return err
		}
		if n, ok := tree.Ended(*id); ok && n.State == branch.Committed {
			ended, err = s.committedResult(ctx, tx, *r, tree, n)
			return err
		}
		if n := tree.Nodes[*id]; n != nil && n.State == branch.Live && n.ID != branch.RootID && len(tree.Children(n.ID)) == 0 {
			if p := tree.Nodes[n.Parent]; p != nil && p.State == branch.Live {
				node, seen = n, checked{parent: p.ID, epoch: p.Epoch}
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("commit: %w", err)
	}
	if ended != nil || node == nil {
		return ended, nil, nil
	}
	tree.SetTombstones(nil)
	if err := s.ensureIDMapView(ctx, *r); err != nil {
		seen.err = fmt.Errorf("commit %s (refused, nothing changed): %w", c, err)
	} else if err := s.checkCommit(ctx, *r, tree, node); err != nil {
		seen.err = fmt.Errorf("commit %s (refused, nothing changed): %w", c, err)
	}
	return nil, &seen, nil
}

// committedResult is what the commit of n (committed, a tombstone) did,
// for a caller that asks again.
func (s *Branches) committedResult(ctx context.Context, tx *bolt.Tx, r rootSnap, tree *branch.Tree, n branch.Node) (*CommitResult, error) {
	plan := branch.CommitPlan{Winner: n.ID, Parent: n.Parent, Epoch: n.WinnerEpoch}
	ended, err := tombstones(tx, r.id())
	if err != nil {
		return nil, err
	}
	for _, e := range ended {
		if e.State == branch.Stale && e.Winner == n.ID && e.WinnerEpoch == n.WinnerEpoch {
			plan.Invalidated = append(plan.Invalidated, e.ID)
		}
	}
	sortNumeric(plan.Invalidated)
	if tree.Nodes[n.Parent] == nil {
		return nil, fmt.Errorf("branch %s was committed into %s (epoch %d), which has ended since: %w", n.ID, branchName(n.Parent), n.WinnerEpoch, errdefs.ErrNotFound)
	}
	tree.SetTombstones(nil)
	return &CommitResult{Plan: plan, Parent: s.describe(ctx, r, tree, n.Parent, false)}, nil
}

// carryOutCommit does everything after a commit's decision. The caller
// holds the root's lock.
func (s *Branches) carryOutCommit(ctx context.Context, c branch.Ref, r rootSnap, plan branch.CommitPlan, resume bool, decided *branch.Tree, awaitSeal func()) (CommitResult, error) {
	// Whether the parent is as before if this attempt fails before its
	// apply changes anything: after a first decision, or after an attempt
	// that was undone.
	clean := !resume || s.undone.isClean(r.id(), plan.Winner)
	// The decision must outlive a power loss before the parent changes, so
	// that a half-applied commit is completed rather than left (branchdb.go).
	// Only reads overlap the sync; nothing changes until it is done.
	synced := make(chan error, 1)
	if resume {
		synced <- nil
	} else {
		go func() { synced <- s.bdb.Sync() }()
	}
	awaitSeal()
	// Read once: the losers' entries are the only ones that go stale, and
	// nothing below asks about them again.
	mounts, mountsErr := overlay.ReadTable()
	if err := <-synced; err != nil {
		s.undone.set(r.id(), plan.Winner, clean)
		return CommitResult{}, fmt.Errorf("commit %s (decided: it won at epoch %d; calling commit again completes it): sync branch metadata: %w", c, plan.Epoch, err)
	}
	s.fault(FaultCommitDecided)
	if mountsErr != nil {
		s.undone.set(r.id(), plan.Winner, clean)
		return CommitResult{}, fmt.Errorf("commit %s (decided: it won at epoch %d; calling commit again, or a restart, completes it): %w", c, plan.Epoch, mountsErr)
	}
	// The losers go first: their processes must not keep writing into
	// layers that are about to be discarded.
	for _, l := range plan.Invalidated {
		s.removeBranchLayer(ctx, mounts, r.id(), l)
	}
	tree, err := s.finishCommit(ctx, r, plan.Winner, resume, mounts, decided)
	if err != nil {
		return CommitResult{}, fmt.Errorf("commit %s (decided: it won at epoch %d): %w", c, plan.Epoch, err)
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "winner": plan.Winner, "parent": plan.Parent, "epoch": plan.Epoch, "invalidated": plan.Invalidated}).Info("committed")
	if tree.Nodes[plan.Parent] == nil {
		return CommitResult{}, fmt.Errorf("commit %s: parent %s left the tree: %w", c, plan.Parent, errdefs.ErrNotFound)
	}
	return CommitResult{Plan: plan, Parent: s.describe(ctx, r, tree, plan.Parent, false)}, nil
}

// finishCommit applies a committing branch's layer to its parent and ends
// the commit. It is idempotent: applying an upper layer to a tree that
// already shows it changes nothing, so recovery may run it again. resume
// says an earlier attempt may have been cut short, leaving temporaries.
//
// If the apply or the final transaction fails, what the apply changed in
// the parent is put back from the journal and the branch stays committing;
// the error then says whether the parent is as before.
//
// mounts is the overlay mount table, or nil to read it here; tree is the
// branch tree as the decision left it, or nil to read it here. It returns
// the tree as the commit leaves it, with no tombstones.
func (s *Branches) finishCommit(ctx context.Context, r rootSnap, id string, resume bool, mounts overlay.Table, tree *branch.Tree) (_ *branch.Tree, retErr error) {
	if tree == nil {
		if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
			tree, err = loadTree(tx, r.id())
			return err
		}); err != nil {
			return nil, err
		}
		if tree == nil {
			return nil, fmt.Errorf("no branch tree for %s: %w", branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		tree.SetTombstones(nil)
	}
	n := tree.Nodes[id]
	if n == nil || n.State != branch.Committing {
		return nil, fmt.Errorf("branch %s is not being committed: %w", id, errdefs.ErrFailedPrecondition)
	}
	upper := s.branchUpper(r.id(), id)
	clean := !resume || s.undone.isClean(r.id(), id)
	var a commitApply
	defer func() {
		retErr = s.endCommitAttempt(ctx, r, id, n.Parent, clean, &a, retErr)
	}()
	// A commit with the winner's own layer gone already finished applying.
	if _, err := os.Lstat(upper); err == nil {
		if err := s.applyCommit(ctx, r, tree, n, upper, resume, mounts, &a); err != nil {
			return nil, err
		}
		s.fault(FaultCommitApplied)
	}
	done, err := s.recordCommitFinished(ctx, r, id, n)
	if err != nil {
		return nil, err
	}
	done.SetTombstones(nil)
	s.fault(FaultCommitFinished)
	s.removeCheckpointOrphans(ctx, r.id())
	// Detached above (or before a crash, or never mounted): only files left.
	s.discard(ctx, s.branchDir(r.id(), id))
	return done, nil
}

// commitApply is what an attempt to apply a commit set up: the journal of
// the parent's upper it keeps, and the parent's live mount it applies
// through (none: a temporary mount).
type commitApply struct {
	journal *apply.Journal
	live    overlay.Live
}

// applyCommit unmounts the winner n wherever the host sees it and applies
// its upper to its parent under a journal: through the parent's live mount
// (unsealed first), else through a temporary mount. mounts is the overlay
// mount table, or nil to read it here.
func (s *Branches) applyCommit(ctx context.Context, r rootSnap, tree *branch.Tree, n *branch.Node, upper string, resume bool, mounts overlay.Table, a *commitApply) error {
	if mounts == nil {
		var err error
		if mounts, err = overlay.ReadTable(); err != nil {
			return err
		}
	}
	mounts.Detach(ctx, upper)
	parentUpper := s.branchUpper(r.id(), n.Parent)
	j := s.newJournal(r.id(), n.ID, parentUpper)
	a.journal = j
	a.live = mounts.Live(parentUpper)
	if a.live.Target == "" {
		return s.applyThroughTempMount(ctx, r, tree, n, upper, resume, j)
	}
	if p := tree.Nodes[n.Parent]; p.SealedByUs {
		if err := s.setSealed(ctx, mounts, parentUpper, p, false); err != nil {
			return fmt.Errorf("unseal parent at %s: %w", a.live.Target, err)
		}
	}
	if err := s.rollbackForCommit(ctx, r, tree, n, a.live.Target, j); err != nil {
		return err
	}
	if err := applyLayer(ctx, upper, a.live.Target, parentUpper, resume, j); err != nil {
		return fmt.Errorf("apply branch %s to its parent through %s: %w", n.ID, a.live.Target, err)
	}
	return nil
}

// recordCommitFinished ends the commit of branch id (n) in the tree: the
// parent takes its place, and is unsealed if it has no live child left.
func (s *Branches) recordCommitFinished(ctx context.Context, r rootSnap, id string, n *branch.Node) (done *branch.Tree, err error) {
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		t, err := loadTree(tx, r.id())
		if err != nil {
			return err
		}
		if t == nil {
			return fmt.Errorf("no branch tree for %s: %w", branch.DisplayKey(r.key), errdefs.ErrNotFound)
		}
		if err := t.FinishCommit(id, time.Now()); err != nil {
			return err
		}
		if p := t.Nodes[n.Parent]; p != nil && !t.Sealed(p.ID) {
			clearSeal(p)
		}
		if err := storeTree(tx, r.id(), t); err != nil {
			return err
		}
		done = t
		return setHead(tx, r.id(), n.Parent, n.FromCheckpoint)
	})
	return done, err
}

// endCommitAttempt ends an attempt of finishCommit whose outcome is err:
// if it failed after its apply began, the parent is put back from the
// journal, and the error says whether the parent is as before (clean: as
// before this commit's first attempt). The journal is discarded last.
func (s *Branches) endCommitAttempt(ctx context.Context, r rootSnap, id, parent string, clean bool, a *commitApply, err error) error {
	if a.journal != nil {
		// Discarded after the restore below, which reads it.
		defer s.discardJournal(ctx, a.journal)
	}
	if err == nil {
		s.undone.set(r.id(), id, false)
		return nil
	}
	if a.journal == nil {
		s.undone.set(r.id(), id, clean)
		return err
	}
	if rerr := s.restoreParent(ctx, a.journal, a.live.Target); rerr != nil {
		s.undone.set(r.id(), id, false)
		log.G(ctx).WithError(rerr).WithFields(log.Fields{"root": r.key, "branch": id}).Error("put the parent back after a failed commit")
		return fmt.Errorf("%w; putting %s back as it was failed too (%v): call commit again to complete it", err, branchName(parent), rerr)
	}
	s.undone.set(r.id(), id, clean)
	if clean {
		return fmt.Errorf("%w; %s was put back as it was: call commit again to retry, or abort the branch", err, branchName(parent))
	}
	return fmt.Errorf("%w; %s was put back as this attempt found it, which may hold part of an earlier one: call commit again to complete it", err, branchName(parent))
}

// applyThroughTempMount mounts an unmounted branch, applies upper through
// that mount, and unmounts it.
func (s *Branches) applyThroughTempMount(ctx context.Context, r rootSnap, tree *branch.Tree, n *branch.Node, upper string, resume bool, j *apply.Journal) (retErr error) {
	id := n.Parent
	target := filepath.Join(s.root, "mnt", r.id()+"-"+id)
	if err := os.MkdirAll(target, 0o700); err != nil {
		return err
	}
	if err := s.ensureIDMapView(ctx, r); err != nil {
		os.Remove(target)
		return fmt.Errorf("mount parent for commit: %w", err)
	}
	mounts := s.branchOverlay(r, tree, id, false)
	if err := mount.All(mounts, target); err != nil {
		os.Remove(target)
		return fmt.Errorf("mount parent for commit: %w", err)
	}
	defer func() {
		if err := mount.UnmountAll(target, 0); err != nil && retErr == nil {
			retErr = fmt.Errorf("unmount parent after commit: %w", err)
		}
		os.Remove(target)
	}()
	if err := s.rollbackForCommit(ctx, r, tree, n, target, j); err != nil {
		return err
	}
	if err := applyLayer(ctx, upper, target, s.branchUpper(r.id(), id), resume, j); err != nil {
		return fmt.Errorf("apply to parent: %w", err)
	}
	return nil
}
