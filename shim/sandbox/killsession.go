//go:build linux

package sandbox

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/internal/procfd"
	"github.com/branchbox/branchbox/shim/cgroup"
)

// An exec leads a session of its own (the branch init and runc's nsexec
// both call setsid for it), so its session is what it started: a shell's
// commands, a test runner's workers, a server put in the background. A
// kill with all (an HTTP exec's timeout, its client gone) signals them
// too, as a terminal's hangup would, not the exec alone: a process of its
// session outlives it otherwise, holding its output open (its wait does
// not end) and running on in the branch. A process that began a session
// of its own (a daemon) is not of it.

// maxSessionRounds bounds the rounds of a SIGKILL of a session: a process
// of it may fork between the list and its kill, and its child is killed
// in the next round.
const maxSessionRounds = 20

// signalSession sends sig to the processes of session sid among those of
// the cgroup path and the cgroups below it (a session's processes are
// looked for only there: its id may be another's once all of them are
// gone), and says how many it signalled.
func (c *Service) signalSession(ctx context.Context, path string, sid int, sig uint32) (int, error) {
	ms, err := c.cgroups.Mounts()
	if err != nil {
		return 0, err
	}
	dirs := cgroup.OneHierarchy(cgroup.DirsIn(ms, path))
	seen := map[int]bool{}
	total := 0
	for range maxSessionRounds {
		pids, err := cgroup.SubtreePids(dirs)
		if err != nil {
			return total, err
		}
		var fresh []int
		for _, pid := range pids {
			if !seen[pid] {
				fresh = append(fresh, pid)
			}
		}
		n, err := procfd.SignalSession(fresh, sid, unix.Signal(sig))
		total += n
		if err != nil || n == 0 || sig != uint32(unix.SIGKILL) {
			return total, err
		}
		// Those signalled are dying (or zombies their parent has yet
		// to reap): only new ones are looked at again.
		for _, pid := range fresh {
			seen[pid] = true
		}
	}
	return total, nil
}

// signalExecSession is signalSession of exec execID's session, whose
// failure names the exec.
func (c *Service) signalExecSession(ctx context.Context, path, execID string, sid int, sig uint32) (int, error) {
	n, err := c.signalSession(ctx, path, sid, sig)
	if err != nil {
		return n, fmt.Errorf("signal the processes of exec %s's session: %w", execID, err)
	}
	return n, nil
}

// killAll is Kill with all: the exec, then the processes of its session,
// which may outlive it. The exec having exited is no failure while one of
// them was still there to signal.
func (c *Service) killAll(ctx context.Context, path string, p interface {
	ID() string
	Pid() int
	Kill(context.Context, uint32, bool) error
}, sig uint32) error {
	kerr := p.Kill(ctx, sig, false)
	if kerr != nil && !errdefs.IsNotFound(kerr) {
		return kerr
	}
	n, err := c.signalExecSession(ctx, path, p.ID(), p.Pid(), sig)
	if err != nil {
		return err
	}
	if kerr != nil && n == 0 {
		return kerr
	}
	return nil
}

// killWaited is a kill with all of an exec whose Wait was answered (and
// which the shim forgot): its session is signalled, by the pid the
// caller had from Exec, among the branch's processes. notFound is the
// answer if none was left.
func (c *Service) killWaited(ctx context.Context, req *shimv1.KillRequest, notFound error) (*shimv1.Empty, error) {
	sb, n, err := c.branchFor(ctx, req.Sandbox, req.Branch, true, false)
	if err != nil {
		return nil, err
	}
	path := n.cgroup
	sb.mu.Unlock()
	signalled, err := c.signalExecSession(ctx, path, req.ExecId, int(req.Pid), req.Signal)
	if err != nil {
		return nil, err
	}
	if signalled == 0 {
		return nil, notFound
	}
	return &shimv1.Empty{}, nil
}

// killTaskSession is a kill with all of an exec of the sandbox's task
// (branch 0), which containerd starts and whose kill it sends to the exec
// alone (its runtime drops all for an exec): the session of the pid the
// caller had from it is signalled among the sandbox's processes.
func (c *Service) killTaskSession(ctx context.Context, req *shimv1.KillRequest) (*shimv1.Empty, error) {
	if req.Pid == 0 {
		return nil, fmt.Errorf("kill the session of exec %q of sandbox %s: no pid given: %w", req.ExecId, req.Sandbox, errdefs.ErrInvalidArgument)
	}
	sb, err := c.Sandbox(req.Sandbox)
	if err != nil {
		return nil, err
	}
	if sb.cgroup == "" {
		return nil, fmt.Errorf("sandbox %s has no cgroup to find its processes in: %w", req.Sandbox, errdefs.ErrFailedPrecondition)
	}
	n, err := c.signalExecSession(ctx, sb.cgroup, req.ExecId, int(req.Pid), req.Signal)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("no process of exec %q's session is left in sandbox %s: %w", req.ExecId, req.Sandbox, errdefs.ErrNotFound)
	}
	return &shimv1.Empty{}, nil
}
