//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/apply"
)

// commitMargin is room kept free beyond what a commit's apply needs: the
// metadata transactions and the journal directory write too.
const (
	commitMarginBytes  = 1 << 20
	commitMarginInodes = 16
)

// checkCommit refuses, before the decision, a commit of branch n that
// could be seen now not to apply: one whose layer is deeper than the apply
// walks, holds what the apply does not implement, would remove a directory
// of the parent deeper than the apply removes, or does not fit in the
// space or inodes free on the snapshotter's filesystem. The parent cannot
// change in between (it is sealed while it has children) nor can the
// branch (the shim kills its processes before it asks for the commit).
func (s *Branches) checkCommit(ctx context.Context, r rootSnap, tree *branch.Tree, n *branch.Node) error {
	upper := s.branchUpper(r.id(), n.ID)
	layers := append([]string{s.branchUpper(r.id(), n.Parent)}, s.lowerDirs(r, tree, n.ID)...)
	needs, err := apply.Measure(ctx, upper, layers)
	if err != nil {
		return fmt.Errorf("branch %s cannot be applied to %s (change it and commit again, or abort it): %w", n.ID, branchName(n.Parent), err)
	}
	return s.checkRoom(ctx, needs, "commit of branch "+n.ID, "or abort the branch")
}

// freedWait is how long a commit or a rollback short of room waits for
// the discarded layers being removed, which may free what it needs.
const freedWait = 10 * time.Second

// checkRoom refuses what needs more space or inodes than the snapshotter's
// filesystem has free, with a margin: what names it, or says what else
// the user can do. Short of room, it looks again once the layers being
// removed are gone: "abort the branch that filled the disk, commit the
// other" must not be refused for the aborted layer still on disk.
func (s *Branches) checkRoom(ctx context.Context, needs apply.Needs, what, or string) error {
	err := s.roomFor(needs, what, or)
	if errdefs.IsResourceExhausted(err) {
		s.awaitFreed(ctx, freedWait)
		err = s.roomFor(needs, what, or)
	}
	return err
}

func (s *Branches) roomFor(needs apply.Needs, what, or string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(s.root, &st); err != nil {
		return fmt.Errorf("free space under %s: %w", s.root, err)
	}
	free := int64(st.Bavail) * st.Bsize
	if need := needs.Bytes + commitMarginBytes; need > free {
		return fmt.Errorf("%s needs %s, %s free under %s; free space there, %s: %w",
			what, megabytes(need), megabytes(free), s.root, or, errdefs.ErrResourceExhausted)
	}
	// A filesystem without a fixed inode table reports none at all.
	if st.Files > 0 {
		if need := needs.Inodes + commitMarginInodes; uint64(need) > st.Ffree {
			return fmt.Errorf("%s needs %d inodes, %d free under %s; remove files there, %s: %w",
				what, need, st.Ffree, s.root, or, errdefs.ErrResourceExhausted)
		}
	}
	return nil
}

// noRoom words a full filesystem's (or a quota's) failure of what, under
// the snapshotter's root, naming the root rather than the directory of a
// branch, which the user never named: resource exhausted. Another error
// is returned as it is.
func (s *Branches) noRoom(err error, what, or string) error {
	for _, errno := range []unix.Errno{unix.ENOSPC, unix.EDQUOT} {
		if errors.Is(err, errno) {
			return fmt.Errorf("no room for %s under %s (%v); free space or inodes there, %s: %w",
				what, s.root, errno, or, errdefs.ErrResourceExhausted)
		}
	}
	return err
}

func branchName(id string) string {
	if id == branch.RootID {
		return "the root"
	}
	return "branch " + id
}

func megabytes(n int64) string {
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}
