//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/containerd/errdefs"
)

// runtimeStartPids is what a branch the runtime starts may hold while it
// starts: the runtime's init is a Go program, whose threads count as
// processes (6 to 7 measured here, waiting for its start), besides the
// runtime's helper processes. Its failure for want of them shows as a
// missing thread or a lost init ("procReady not received"), rarely as an
// EAGAIN in its words.
const runtimeStartPids = 8

// pidsRefusal is a fork refused by a process limit, in one line in the
// user's terms: whose limit (the sandbox's, a branch's, the new branch's
// own, or a cgroup's above the sandbox) and its value.
func (sb *Sandbox) pidsRefusal(parent *Branch, pl *cgroup.PidsLimit) error {
	what := "fork of sandbox " + sb.id
	if parent.id != branch.RootID {
		what = "fork of branch " + sb.id + "/" + parent.id
	}
	return sb.pidsWords(what, parent, pl)
}

// execFailed words an exec of args in branch n that failed to start: one
// whose branch ended meanwhile says so (stale, with the winner, or not
// found); one that failed for want of a process (EAGAIN) in n, or a
// cgroup above it, at its process limit names the limit (otherwise the
// start's "Resource temporarily unavailable", of no kind).
func (c *Service) execFailed(ctx context.Context, sb *Sandbox, n *Branch, args []string, err error) error {
	what := fmt.Sprintf("exec %v in %s/%s", args, sb.id, n.id)
	// A branch killed while the process started (aborted, or invalidated
	// by a sibling's commit) fails the start with what its end left (the
	// init gone, a namespace or cgroup gone): its own state says why.
	if berr := c.branchEnded(ctx, sb.id, n.id); berr != nil {
		return fmt.Errorf("%s: the branch ended as the process started: %w", what, berr)
	}
	if ms, merr := c.cgroups.Mounts(); merr == nil {
		if pl := cgroup.AsPidsLimit([]error{err}, cgroup.PidsLimits(ms, n.cgroup), 0); pl != nil {
			return sb.pidsWords(what, n, pl)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// branchEnded says why branch id of the sandbox ended, as the next call
// on it would (stale, naming the winner; or not found): nil while it is
// live, or if that cannot be told.
func (c *Service) branchEnded(ctx context.Context, sandboxID, id string) error {
	if ctx.Err() != nil {
		return nil
	}
	_, _, err := c.branchFor(ctx, sandboxID, id, false, false)
	if errors.As(err, new(*branch.StaleError)) || errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// pidsWords is a refusal of what by a process limit, in the user's terms.
func (sb *Sandbox) pidsWords(what string, parent *Branch, pl *cgroup.PidsLimit) error {
	cg := filepath.Clean(pl.Cgroup)
	whose := ""
	for _, n := range sb.nodes {
		if filepath.Clean(n.cgroup) != cg {
			continue
		}
		whose = branchName(n.id) + "'s"
	}
	if whose == "" {
		if strings.HasPrefix(cg, filepath.Clean(parent.cgroup)+"/") {
			whose = "the new branch's own"
		} else {
			whose = "cgroup " + cg + "'s (above the sandbox)"
		}
	}
	need := ""
	if pl.Need > 0 {
		need = fmt.Sprintf(" (%d free, the fork needs %d)", max(pl.Room(), 0), pl.Need)
	}
	return fmt.Errorf("%s: %s process limit (pids.max %d) is reached%s: %w", what, whose, pl.Max, need, errdefs.ErrResourceExhausted)
}
