//go:build linux

package shim

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containerd/log"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// sealFork asks the snapshotter to fork parent, sealing it as req.Seal
// says:
//
//   - SealFreeze: the parent's own processes are frozen first, and the
//     snapshotter is told so (branch.WithParentFrozen): the freeze is the
//     seal, nothing is remounted, and files they hold open for writing do
//     not matter.
//   - SealReadOnly (the default): the parent's rootfs is made read-only.
//     If files are open for writing there, which no read-only remount can
//     take from under their writers, and every writer is one of the
//     parent's own processes, those are frozen instead for the branches'
//     lifetime (a log being written, a database, a dev server would
//     otherwise make the sandbox unforkable). A writer outside them (a
//     process on the host writing through the rootfs path) is named in the
//     error: only closing its file helps.
//
// The parent is thawed by unsealIfIdle when its last branch ends, or here
// if the fork fails.
func (c *contexts) sealFork(ctx context.Context, sb *sandbox, parent *bctx, req *shimv1.ForkRequest) (_ []branch.Info, retErr error) {
	froze := false
	defer func() {
		if retErr != nil && froze {
			c.unsealIfIdle(ctx, sb, parent)
		}
	}()
	if req.Seal == SealFreeze {
		if !parent.frozen {
			if err := freezeOwn(ctx, parent.cgroup); err != nil {
				return nil, err
			}
			parent.frozen, froze = true, true
		}
		return sb.snapshot.ForkFrom(ctx, sb.ref(parent.id), int(req.Count), req.FromCheckpoint, branch.WithParentFrozen())
	}
	infos, err := sb.snapshot.ForkFrom(ctx, sb.ref(parent.id), int(req.Count), req.FromCheckpoint)
	var we *branch.WritersError
	if err == nil || !errors.As(err, &we) || parent.frozen {
		return infos, err
	}
	if outside := writersOutside(parent.cgroup, we.Writers); len(outside) > 0 || len(we.Writers) == 0 {
		return nil, fmt.Errorf("fork %s of %s: %w", parent.id, sb.id, &branch.WritersError{Context: we.Context, Writers: outside})
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "context": parent.id, "writers": we.Writers}).Info("files are open for writing: freezing the parent's processes for its branches' lifetime instead of making its rootfs read-only")
	if err := freezeOwn(ctx, parent.cgroup); err != nil {
		return nil, err
	}
	parent.frozen, froze = true, true
	return sb.snapshot.ForkFrom(ctx, sb.ref(parent.id), int(req.Count), req.FromCheckpoint, branch.WithParentFrozen())
}

// writersOutside returns the writers that are not processes of cgroup's
// own (on the hierarchy that lists them all: the freezer's, or v2), which
// freezing that cgroup would not stop.
func writersOutside(cgroup string, writers []branch.Writer) []branch.Writer {
	own := map[int]bool{}
	dirs, err := cgroupDirs(cgroup)
	if err == nil {
		for _, d := range oneHierarchy(dirs) {
			for _, pid := range readPids(filepath.Join(d.dir, "cgroup.procs")) {
				own[pid] = true
			}
		}
	}
	var out []branch.Writer
	for _, w := range writers {
		if !own[w.Pid] {
			out = append(out, w)
		}
	}
	return out
}
