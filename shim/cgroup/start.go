//go:build linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/lockedthread"
)

// StartIn starts argv inside its cgroup (paths: a cgroup manager's
// directories by controller), so that the process limit of the cgroup and
// of every one above it holds from its first instant. On cgroup2 (the
// unified hierarchy, also that of a hybrid host) it is cloned into it
// (CLONE_INTO_CGROUP). On v1 hierarchies, which have no such flag, it is
// forked by a thread of ours that joins its pids and memory cgroups for
// the moment of the fork: the kernel charges a child to its parent
// thread's cgroup and checks every pids.max above it. That thread is
// counted there while it forks, so a limited cgroup must have room for two
// (checked first, and clones into limited cgroups go one at a time, so
// that the thread's own unchecked move never takes a cgroup past its
// limit). It returns the child's pid and the directories it was born in;
// a fork refused by a process limit is a *PidsLimit.
func (h *Host) StartIn(ctx context.Context, cgroupPath string, paths map[string]string, argv0 string, argv []string, attr *syscall.ProcAttr) (int, map[string]bool, error) {
	ms, err := h.Mounts()
	if err != nil {
		return 0, nil, err
	}
	born := map[string]bool{}
	var join []threadMove // v1 cgroups the forking thread joins
	// Of the v1 controllers, those that charge a process from its fork: a
	// v1 move is not checked against pids.max (only a fork is), and
	// memory charged before a move stays where it was made. The other
	// hierarchies take a move before the init runs anything of the
	// branch.
	for _, ctrl := range []string{"pids", "memory"} {
		dir, ok := paths[ctrl]
		if !ok || born[dir] {
			continue
		}
		for _, m := range ms {
			if !m.V2 && ((ctrl == "pids" && m.Pids) || (ctrl == "memory" && m.Memory)) {
				join = append(join, threadMove{ctrl: ctrl, root: m.Path, to: dir})
				born[dir] = true
				break
			}
		}
	}
	unified := -1
	if dir, ok := paths[""]; ok {
		if unified, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return 0, nil, fmt.Errorf("open cgroup %s: %w", cgroupPath, err)
		}
		defer unix.Close(unified)
		sys := *attr.Sys
		sys.UseCgroupFD, sys.CgroupFD = true, unified
		a := *attr
		a.Sys = &sys
		attr = &a
	}
	need := int64(1)
	if len(join) > 0 && join[0].ctrl == "pids" {
		need = 2
		if levels := PidsLimits(ms, cgroupPath); len(levels) > 0 {
			h.cloneMu.Lock()
			defer h.cloneMu.Unlock()
			// Read again under the lock: a clone that went before took
			// room.
			if t := Tightest(PidsLimits(ms, cgroupPath), need); t != nil {
				return 0, nil, &PidsLimit{PidsLevel: *t}
			}
		}
	}
	pid, err := forkIn(ctx, join, argv0, argv, attr)
	if errors.Is(err, unix.ENOSYS) && unified >= 0 {
		// No clone3 (Linux before 5.7): the unified hierarchy takes a
		// move, as the v1 hierarchies without a limit do.
		attr.Sys.UseCgroupFD = false
		pid, err = forkIn(ctx, join, argv0, argv, attr)
		unified = -1
	}
	if err != nil {
		if errors.Is(err, unix.EAGAIN) {
			levels := PidsLimits(ms, cgroupPath)
			if t := Tightest(levels, need); t != nil {
				return 0, nil, &PidsLimit{PidsLevel: *t}
			}
			if pl := AsPidsLimit([]error{err}, levels, 0); pl != nil {
				return 0, nil, pl
			}
		}
		return 0, nil, err
	}
	if unified >= 0 {
		born[paths[""]] = true
	}
	return pid, born, nil
}

// threadMove is one v1 cgroup the forking thread joins: to, on the
// hierarchy mounted at root, of controller ctrl.
type threadMove struct {
	ctrl, root, to string
}

// forkIn forks argv from a locked thread (not the main one) that is in
// the cgroups of join for the moment of the fork. A thread that cannot be
// taken back out is never unlocked, so that it ends with its goroutine
// rather than run the shim's code in a branch's cgroup.
func forkIn(ctx context.Context, join []threadMove, argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if len(join) == 0 {
		return syscall.ForkExec(argv0, argv, attr)
	}
	type result struct {
		pid int
		err error
	}
	done := make(chan result, 1)
	// Not the main thread: in a cgroup it would list the whole shim in
	// its cgroup.procs, for a kill or the OOM killer to find.
	lockedthread.Go(func() {
		back, err := joinThread(join)
		pid := 0
		if err == nil {
			pid, err = syscall.ForkExec(argv0, argv, attr)
		}
		if lerr := leaveThread(back); lerr != nil {
			log.G(ctx).WithError(lerr).Warn("take a shim thread back out of a branch cgroup; it ends instead")
			done <- result{pid, err}
			return
		}
		runtime.UnlockOSThread()
		done <- result{pid, err}
	})
	r := <-done
	return r.pid, r.err
}

// joinThread moves the calling thread (locked) into the cgroups of join,
// writing "0" (the caller) to their tasks files, which moves the thread
// alone. It returns the thread's own cgroups to go back to, as far as it
// left them.
func joinThread(join []threadMove) ([]string, error) {
	own, err := cgroups.ParseCgroupFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read the shim thread's cgroups: %w", err)
	}
	var back []string
	for _, j := range join {
		p, ok := own[j.ctrl]
		if !ok {
			return back, fmt.Errorf("the shim thread has no %s cgroup: %w", j.ctrl, os.ErrNotExist)
		}
		if err := os.WriteFile(filepath.Join(j.to, "tasks"), []byte("0"), 0); err != nil {
			return back, fmt.Errorf("join cgroup %s to fork into it: %w", j.to, err)
		}
		back = append(back, filepath.Join(j.root, p))
	}
	return back, nil
}

// leaveThread moves the calling thread back into its own cgroups.
func leaveThread(back []string) error {
	var errs []error
	for _, dir := range back {
		if err := os.WriteFile(filepath.Join(dir, "tasks"), []byte("0"), 0); err != nil {
			errs = append(errs, fmt.Errorf("back to cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}
