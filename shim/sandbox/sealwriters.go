//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/cgroup"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/procfd"
)

// sealFork asks the snapshotter to fork parent, sealing it as req.Seal
// says:
//
//   - SealFreeze: the parent's own processes are frozen first, and the
//     snapshotter is told so (branchapi.WithParentFrozen): the freeze is the
//     seal, nothing is remounted, and files they hold open for writing do
//     not matter.
//   - SealReadOnly (the default): the parent's rootfs is made read-only.
//     If files are open for writing there, which no read-only remount can
//     take from under their writers, and every writer is one of the
//     parent's own processes, those are frozen instead for the branches'
//     lifetime (a log being written, a database, a dev server would
//     otherwise make the sandbox unforkable). A writer outside them (a
//     process on the host writing through the rootfs path) is named in the
//     error: only closing its file helps. A fork asked for from inside
//     the sandbox (branchctl self fork) is not frozen so: its caller may be
//     one of those processes, and may mean to drive the branches itself.
//
// The parent is thawed by unsealIfIdle when its last branch ends, or here
// if the fork fails.
func (c *Service) sealFork(ctx context.Context, sb *Sandbox, parent *Branch, initPid int, req *shimv1.ForkRequest) (_ []branch.Info, retErr error) {
	froze := false
	defer func() {
		if retErr != nil && froze {
			c.unsealIfIdle(ctx, sb, parent)
		}
	}()
	if req.Seal == SealFreeze {
		if !parent.state.has(sealFrozen) {
			if err := cgroup.FreezeOwn(ctx, parent.cgroup); err != nil {
				return nil, err
			}
			parent.state.set(sealFrozen)
			froze = true
		}
		return sb.snapshot.ForkFrom(ctx, sb.ref(parent.id), int(req.Count), req.FromCheckpoint, branchapi.WithParentFrozen())
	}
	// A refused seal costs a scan of every open file on the host (to name
	// the writers): a branch whose last fork found its own processes
	// writing has just theirs checked, and is frozen at once if they still
	// are.
	if parent.writers && !parent.state.has(sealFrozen) && !isSelfFork(ctx) {
		if ownWriters(parent.cgroup, initPid) {
			if err := cgroup.FreezeOwn(ctx, parent.cgroup); err != nil {
				return nil, err
			}
			parent.state.set(sealFrozen)
			froze = true
			return sb.snapshot.ForkFrom(ctx, sb.ref(parent.id), int(req.Count), req.FromCheckpoint, branchapi.WithParentFrozen())
		}
		parent.writers = false
	}
	var (
		infos []branch.Info
		err   error
		we    *branch.WritersError
	)
	// A seal refused with no writer left to name: the file was closed
	// between the refusal and the scan (a shell that wrote a file and
	// exec'd, say). Nothing was changed; it is tried again.
	for try := 0; ; try++ {
		we = nil
		infos, err = sb.snapshot.ForkFrom(ctx, sb.ref(parent.id), int(req.Count), req.FromCheckpoint)
		if err == nil || !errors.As(err, &we) || len(we.Writers) > 0 || try == 2 {
			break
		}
	}
	if err == nil || we == nil || parent.state.has(sealFrozen) {
		return infos, err
	}
	if isSelfFork(ctx) {
		// The caller is one of the processes the freeze would stop, and
		// may be the one to drive the branches: it is told, and asks for
		// --seal freeze if it means it.
		return nil, err
	}
	if outside := writersOutside(parent.cgroup, we.Writers); len(outside) > 0 || len(we.Writers) == 0 {
		return nil, fmt.Errorf("%s: %w", forkOf(sb.id, parent.id), &branch.WritersError{Branch: we.Branch, Writers: outside})
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "branch": parent.id, "writers": we.Writers}).Info("files are open for writing: freezing the parent's processes for its branches' lifetime instead of making its rootfs read-only")
	if err := cgroup.FreezeOwn(ctx, parent.cgroup); err != nil {
		return nil, err
	}
	parent.state.set(sealFrozen)
	froze, parent.writers = true, true
	return sb.snapshot.ForkFrom(ctx, sb.ref(parent.id), int(req.Count), req.FromCheckpoint, branchapi.WithParentFrozen())
}

// ownWriters says whether a process of cgroup's own holds a file open for
// writing on a mount, in initPid's mount namespace, of the filesystem that
// is initPid's root (internal/procfd: one statx per descriptor, flags read
// only for those on such a mount).
func ownWriters(cgPath string, initPid int) bool {
	mounts, err := procfd.RootMounts(initPid)
	if err != nil {
		return true // unknown: let the freeze decide
	}
	dirs, err := cgroup.Dirs(cgPath)
	if err != nil {
		return true
	}
	var pids []int
	for _, d := range cgroup.OneHierarchy(dirs) {
		pids = append(pids, cgroup.ReadPids(d.Path)...)
	}
	return procfd.AnyWriterAmong(pids, mounts)
}

// writersOutside returns the writers that are not processes of cgroup's
// own (on the hierarchy that lists them all: the freezer's, or v2), which
// freezing that cgroup would not stop.
func writersOutside(cgPath string, writers []branch.Writer) []branch.Writer {
	own := map[int]bool{}
	dirs, err := cgroup.Dirs(cgPath)
	if err == nil {
		for _, d := range cgroup.OneHierarchy(dirs) {
			for _, pid := range cgroup.ReadPids(d.Path) {
				own[pid] = true
			}
		}
	}
	var out []branch.Writer
	for _, w := range writers {
		if !own[w.Pid] && !inCgroup(w.Pid, cgPath) {
			out = append(out, w)
		}
	}
	return out
}

// inCgroup says whether pid is in cgroup (or its seal or v2 leaf) on some
// hierarchy, or is gone: a writer that ended (a short-lived child that
// inherited a descriptor, such as a sleep in a shell loop) is no writer.
func inCgroup(pid int, cgPath string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)
	}
	cgPath = filepath.Clean("/" + cgPath)
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[2] == cgPath || parts[2] == cgPath+"/"+cgroup.SealLeaf || parts[2] == cgPath+"/"+cgroup.OwnLeaf) {
			return true
		}
	}
	return false
}

// selfForkKey marks a fork asked for through a branch's own socket.
type selfForkKey struct{}

func withSelfFork(ctx context.Context) context.Context {
	return context.WithValue(ctx, selfForkKey{}, true)
}

func isSelfFork(ctx context.Context) bool {
	v, _ := ctx.Value(selfForkKey{}).(bool)
	return v
}
