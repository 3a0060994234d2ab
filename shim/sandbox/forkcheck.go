//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"strings"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	tasktypes "github.com/containerd/containerd/api/types/task"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// The checks of a fork request, before anything is made or sealed: its
// limits, the sandbox's bounds, the parent's init, the process limits'
// room. Here together so that a fork's path reads them in one file.

// checkBranches refuses a fork of count branches of parent that would
// pass the sandbox's bounds (under sb.mu, with sb loaded): nothing is
// changed.
func (sb *Sandbox) checkBranches(parent *Branch, count int) error {
	b := sb.bounds
	if count > b.maxBranches {
		return fmt.Errorf("fork: count %d is more than sandbox %s may have live, %d (%s): give 1 to %d: %w",
			count, sb.id, b.maxBranches, b.branchesFrom, b.maxBranches, errdefs.ErrInvalidArgument)
	}
	live := len(sb.nodes) - 1 // all but the sandbox itself
	if live+count > b.maxBranches {
		if live >= b.maxBranches {
			return fmt.Errorf("sandbox %s has %s, its maximum (%s): abort some first: %w",
				sb.id, counted(live, "live branch", "live branches"), b.branchesFrom, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("sandbox %s has %s and a fork of %d would make %d, over its maximum of %d (%s): abort some first: %w",
			sb.id, counted(live, "live branch", "live branches"), count, live+count, b.maxBranches, b.branchesFrom, errdefs.ErrResourceExhausted)
	}
	depth := 0
	for n := parent; n != nil && n.parent != ""; n = sb.nodes[n.parent] {
		depth++
		if depth > MaxMaxDepth {
			break // a broken parent chain; the snapshotter has the last word
		}
	}
	if depth+1 > b.maxDepth {
		return fmt.Errorf("sandbox %s: branch %s is %d levels deep, and its branches would be deeper than the maximum of %d (%s): %w",
			sb.id, parent.id, depth, b.maxDepth, b.depthFrom, errdefs.ErrResourceExhausted)
	}
	return nil
}

// initPid is the pid of a branch's init on the host.
func (c *Service) initPid(ctx context.Context, sb *Sandbox, n *Branch) (int, error) {
	procs := n.procs()
	if procs == nil {
		st, err := c.task.State(ctx, &taskAPI.StateRequest{ID: sb.id})
		if err != nil {
			return 0, errgrpc.ToNative(err)
		}
		if st.Status != tasktypes.Status_RUNNING && st.Status != tasktypes.Status_PAUSED {
			return 0, fmt.Errorf("sandbox %s is %s, not running: start its task first: %w", sb.id, strings.ToLower(st.Status.String()), errdefs.ErrFailedPrecondition)
		}
		return int(st.Pid), nil
	}
	pid := procs.Pid()
	if n.state.has(exited) || pid <= 0 {
		return 0, fmt.Errorf("branch %s has no running init (its command exited): %w", n.id, errdefs.ErrFailedPrecondition)
	}
	return pid, nil
}

// pidsRoom refuses up front, before anything is made or sealed, a fork
// that needs more processes than the limits above its parent leave: one
// per branch init, one more per branch given a command on the branch-init
// path (the init forks it), less the inits started ahead that a fork of
// the root takes (they are counted already), and on a v1 pids hierarchy
// one for the moment of a clone (the shim's forking thread, or the
// runtime's first process, is in the cgroup unchecked while it forks). A
// fork that passes can still be refused by the kernel, as the sandbox's
// own processes fork meanwhile or the runtime's helper processes need
// more; the branches it made so far are then rolled back (Fork).
func (c *Service) pidsRoom(sb *Sandbox, parent *Branch, ms []cgroup.Dir, runtimePath bool, req *shimv1.ForkRequest) error {
	per := int64(1)
	if len(req.Args) > 0 && !runtimePath {
		per = 2
	}
	need := int64(req.Count) * per
	if !runtimePath && parent.id == branch.RootID && req.Net == NetShared && sb.pool != nil {
		need -= int64(min(sb.pool.Count(), int(req.Count)))
	}
	if pl := cgroup.PidsShort(ms, parent.cgroup, need); pl != nil {
		return sb.pidsRefusal(parent, pl)
	}
	return nil
}

// planFork finds the parent of a fork and checks, before anything is made
// or sealed, that the fork can be made: the parent runs and is not held
// for a commit, the sandbox's bounds and process limits have room, and a
// memory fork's processes can be dumped.
func (c *Service) planFork(ctx context.Context, sb *Sandbox, req *shimv1.ForkRequest) (*fork, error) {
	f := &fork{sb: sb, req: req, parentID: req.Parent}
	if f.parentID == "" {
		f.parentID = branch.RootID
	}
	parent, ok := sb.nodes[f.parentID]
	if !ok {
		// Let the snapshotter say what became of it (stale, committed...).
		if _, err := sb.snapshot.Mounts(ctx, sb.ref(f.parentID)); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("branch %s of %s is not running: %w", f.parentID, sb.id, errdefs.ErrNotFound)
	}
	f.parent = parent
	if parent.state.has(held) {
		return nil, fmt.Errorf("%s: it is frozen until the snapshotter answers and says whether its commit was made; call commit again to learn it: %w", forkOf(sb.id, f.parentID), errdefs.ErrFailedPrecondition)
	}
	if err := sb.checkBranches(parent, int(req.Count)); err != nil {
		return nil, err
	}
	pid, err := c.initPid(ctx, sb, parent)
	if err != nil {
		return nil, err
	}
	f.pid = pid
	if req.Memory {
		if err := c.checkMemoryFork(ctx, sb, parent, pid, req); err != nil {
			return nil, err
		}
		if req.FromCheckpoint != "" {
			if f.img, err = c.checkpointImage(ctx, sb, parent, req.FromCheckpoint, int(req.Count), req.Limits.GetMemory()); err != nil {
				return nil, err
			}
		}
	}
	f.ms, _ = c.cgroups.Mounts()
	// A memory branch is restored by the runtime, not the branch init.
	f.runtimePath = req.Memory || c.inits.Binary == "" || initdriver.Unsupported(parent.spec) != ""
	if err := c.pidsRoom(sb, parent, f.ms, f.runtimePath, req); err != nil {
		if f.img != nil {
			f.img.remove(context.WithoutCancel(ctx))
		}
		return nil, err
	}
	f.join = joinOf(pid, req.Net)
	return f, nil
}

// joinOf is what a branch of the process pid joins of its namespaces:
// its user namespace, and its network namespace with net shared.
func joinOf(pid int, net string) joinNS {
	j := joinNS{user: fmt.Sprintf("/proc/%d/ns/user", pid)}
	if net == NetShared {
		j.net = fmt.Sprintf("/proc/%d/ns/net", pid)
	}
	return j
}
