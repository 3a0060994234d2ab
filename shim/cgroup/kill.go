//go:build linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// KillDirs SIGKILLs every process in a cgroup (its directories on every
// hierarchy, dirs) and below it, until none is left. Processes are found by
// the kernel's accounting, so a process cannot escape by forking,
// double-forking, changing session or entering a nested PID namespace.
// A frozen process is signalled, then thawed (SignalBranch): it dies as it
// thaws, without running another instruction of its own.
func KillDirs(ctx context.Context, path string, dirs []Dir) error {
	if len(dirs) == 0 {
		return nil
	}
	if err := SignalBranch(ctx, dirs, true); err != nil {
		// KillLoop kills them one by one and must see the cgroup empty.
		log.G(ctx).WithError(err).WithField("cgroup", path).Warn("kill processes before their thaw")
	}
	return KillLoop(ctx, path, dirs, dirs[:1])
}

// SignalBranch sends SIGKILL to every process of a branch once, then
// thaws it if the shim froze it or a part of it (frozen: a frozen task on
// cgroup v1 acts on its SIGKILL only once thawed; signalled first, it
// dies as it thaws). Where the kill is atomic (cgroup.kill) none of them
// runs another instruction of its own once it returns; what their exits
// wait for (their namespaces, their mounts) is AwaitBranch's.
func SignalBranch(ctx context.Context, dirs []Dir, frozen bool) error {
	if len(dirs) == 0 {
		return nil
	}
	err := SignalAll(ctx, dirs)
	if frozen {
		Thaw(dirs)
	}
	return err
}

// AwaitBranch waits until the processes SignalBranch killed (signalErr is
// its error) are gone. The kernel kills the rest of the init's PID
// namespace as the init dies and reports the init's exit only once they
// are all gone, so that is waited for rather than polled. The cgroup is
// then checked on one hierarchy (on cgroup v2 its populated flag covers
// the subtree in one read), not on all of them as KillDirs does; only a
// process put into it from outside the namespace could be elsewhere, and
// release kills those before it removes the cgroup.
func AwaitBranch(ctx context.Context, path string, dirs []Dir, initPidfd int, signalErr error) error {
	if len(dirs) == 0 {
		return nil
	}
	if signalErr == nil && WaitExit(initPidfd, time.Now().Add(100*time.Millisecond)) && !populated(dirs) {
		return nil
	} else if signalErr != nil {
		log.G(ctx).WithError(signalErr).WithField("cgroup", path).Warn("kill branch processes at once; killing them one by one")
	}
	// The init is not gone (frozen by someone else?), something outside
	// its namespace is in the cgroup, or the kill at once failed: the slow
	// way, which fails unless the cgroup is seen empty.
	return KillDirs(ctx, path, dirs)
}

// SignalAll kills every process of a cgroup once: all at once where
// cgroup.kill exists (cgroup v2, Linux 5.14), one by one on the first v1
// hierarchy.
func SignalAll(ctx context.Context, dirs []Dir) error {
	if err := killAtOnce(dirs); err != nil {
		return err
	}
	if !dirs[0].hier().killsAtOnce() {
		pids, err := SubtreePids(dirs[:1])
		if err != nil {
			return err
		}
		KillPids(ctx, pids)
	}
	return nil
}

// killAtOnce kills each whole subtree of dirs atomically where the
// hierarchy can (cgroup.kill on v2, Linux 5.14; hierarchy.kill). A kernel
// without it is left to the kill one by one; any other failure (a
// threaded cgroup refuses it) is an error.
func killAtOnce(dirs []Dir) error {
	var errs []error
	for _, d := range dirs {
		if err := d.hier().kill(d.Path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// KillPids SIGKILLs each of pids but the caller's own process: on cgroup
// v1 a thread of the shim joins a cgroup while it forks a branch's init
// there (StartIn), and the cgroup's processes then list the shim.
func KillPids(ctx context.Context, pids []int) {
	self := os.Getpid()
	for _, pid := range pids {
		if pid == self {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			log.G(ctx).WithError(err).WithField("pid", pid).Warn("kill branch process")
		}
	}
}

// populated says whether a cgroup or one below it holds a process, as its
// v2 directory's cgroup.events says, or else the first v1 hierarchy.
func populated(dirs []Dir) bool {
	for _, d := range dirs {
		p, known, err := d.hier().populated(d.Path)
		if err != nil {
			break
		}
		if known {
			return p
		}
	}
	pids, err := SubtreePids(dirs[:1])
	return err != nil || len(pids) > 0 // unreadable: maybe populated
}

// KillLoop kills the processes of dirs until none is left, watching the
// hierarchies of watch while they die and checking all before it returns.
func KillLoop(ctx context.Context, path string, dirs, watch []Dir) error {
	if err := killAtOnce(dirs); err != nil {
		// The processes are still killed one by one below, and the
		// cgroup must be seen empty.
		log.G(ctx).WithError(err).WithField("cgroup", path).Warn("kill branch processes at once")
	}
	// Every process is in every hierarchy, so one hierarchy is watched
	// while they die, and all of them are checked before returning. The
	// poll starts short: a killed branch is usually gone within a
	// millisecond, and a long first sleep would be most of a commit.
	delay := 50 * time.Microsecond
	for deadline := time.Now().Add(10 * time.Second); ; {
		pids, err := SubtreePids(watch)
		if err != nil {
			return fmt.Errorf("kill the processes of cgroup %s: %w", path, err)
		}
		if len(pids) == 0 {
			if len(watch) == len(dirs) {
				return nil
			}
			watch = dirs
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in cgroup %s after 10s of SIGKILL: %w", pids, path, errdefs.ErrUnavailable)
		}
		KillPids(ctx, pids)
		time.Sleep(delay)
		if delay < 10*time.Millisecond {
			delay *= 2
		}
	}
}

// WaitExit waits until the process of pidfd has exited, or deadline, and
// says whether it has.
func WaitExit(pidfd int, deadline time.Time) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return false
		}
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
	}
}

// RemoveDirs removes a cgroup (its directories on every hierarchy) and its
// descendants, deepest first. Its processes must be gone.
func RemoveDirs(dirs []Dir) error {
	var errs []error
	for _, d := range dirs {
		list := Subdirs(d.Path)
		for i := len(list) - 1; i >= 0; i-- {
			var lastErr error
			for try := 0; try < 50; try++ {
				// An exiting task can keep a cgroup busy for a moment.
				if lastErr = unix.Rmdir(list[i]); lastErr == nil || errors.Is(lastErr, unix.ENOENT) {
					lastErr = nil
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			if lastErr != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", list[i], lastErr))
			}
		}
	}
	return errors.Join(errs...)
}
