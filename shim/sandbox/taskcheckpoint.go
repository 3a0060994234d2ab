//go:build linux

package sandbox

// containerd's checkpoint of a sandbox's task (nerdctl checkpoint create,
// ctr containers checkpoint --task, the CRI's CheckpointContainer) pauses
// the task, then has the runtime dump it from its frozen cgroup: CRIU
// thaws that cgroup once it holds the processes under ptrace, and freezes
// it again after. Processes that the seal of a fork froze are in leaf
// cgroups frozen by themselves, which stay frozen when their parent thaws:
// CRIU would wait on them until its timeout. While the sandbox is paused
// its cgroup holds them frozen anyway, so their leaves are thawed for the
// dump and frozen again after it, before containerd resumes the sandbox,
// with no branch operation in between.

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"

	"github.com/branchbox/branchbox/shim/cgroup"
)

// TaskCheckpoint runs dump, containerd's checkpoint of the task id, with
// the sandbox's seal leaves thawed under its pause.
func (c *Service) TaskCheckpoint(ctx context.Context, id string, dump func() error) error {
	sb, err := c.Sandbox(id)
	if err != nil {
		return dump() // not one of ours to branch
	}
	if err := lockDrained(sb, "checkpoint of sandbox "+sb.id, "not checkpointed"); err != nil {
		return err
	}
	defer sb.mu.Unlock()
	leaves, names, err := c.sealLeaves(sb)
	if err != nil {
		return fmt.Errorf("checkpoint of sandbox %s: %w", sb.id, err)
	}
	if len(leaves) == 0 {
		return dump()
	}
	if !c.Paused(sb) {
		return fmt.Errorf("checkpoint of sandbox %s: the processes of %s are frozen by the seal of a fork while it has branches, and can be dumped only from the paused sandbox: pause it first (containerd's clients do), or commit or abort the branches: %w",
			sb.id, strings.Join(names, ", "), errdefs.ErrFailedPrecondition)
	}
	for i, l := range leaves {
		if err := cgroup.SetFreezer(l.Dir, l.Path, cgroups.Thawed); err != nil {
			refreeze(ctx, sb, leaves[:i])
			return fmt.Errorf("checkpoint of sandbox %s: thaw the processes its seal froze, under its pause: %w", sb.id, err)
		}
	}
	defer refreeze(ctx, sb, leaves)
	return dump()
}

// sealLeaves is the frozen seal leaves of the sandbox's live branches (its
// root's included), and the branches' names.
func (c *Service) sealLeaves(sb *Sandbox) ([]cgroup.Leaf, []string, error) {
	var leaves []cgroup.Leaf
	var names []string
	var ms []cgroup.Dir
	for _, n := range sb.nodes {
		if !n.state.has(sealFrozen) || n.cgroup == "" {
			continue
		}
		if ms == nil {
			var err error
			if ms, err = c.cgroups.Mounts(); err != nil {
				return nil, nil, err
			}
		}
		names = append(names, branchName(n.id))
		leaves = append(leaves, cgroup.SealLeaves(ms, n.cgroup)...)
	}
	sort.Strings(names)
	return leaves, names, nil
}

// refreeze freezes the seal leaves again. It cannot fail the checkpoint:
// the dump is made. A leaf left thawed would let sealed processes run once
// the sandbox resumes, so it is said loudly.
func refreeze(ctx context.Context, sb *Sandbox, leaves []cgroup.Leaf) {
	for _, l := range leaves {
		if err := cgroup.SetFreezer(l.Dir, l.Path, cgroups.Frozen); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", sb.id).WithField("cgroup", l.Path).Error("freeze the sealed processes again after a checkpoint: they run once the sandbox resumes")
		}
	}
}
