//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	cgfs "github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	"golang.org/x/sys/unix"
)

// sealLeaf is the child cgroup a context's own processes are moved into
// to freeze them (--seal freeze): freezing the context's cgroup itself
// would freeze its branches too, since they are nested below it.
const sealLeaf = ".sealed"

// cgroupMount is one mounted cgroup hierarchy.
type cgroupMount struct {
	dir     string
	v2      bool
	freezer bool
	memory  bool
	pids    bool // the pids controller is here (on v2: enabled at its root)
}

// cgroupMounts lists the host's cgroup hierarchies (v1 controllers and the
// unified v2 tree), read afresh: hierarchies are not mutable state of ours.
// Not cgroups.GetCgroupMounts: on a v1 or hybrid host it leaves out the
// unified hierarchy and lists only this process's controllers, read once.
func cgroupMounts() ([]cgroupMount, error) {
	infos, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup mounts: %w", err)
	}
	seen := map[string]bool{}
	var out []cgroupMount
	for _, m := range infos {
		if seen[m.Mountpoint] || m.Root != "/" {
			continue
		}
		seen[m.Mountpoint] = true
		opts := "," + m.VFSOptions + ","
		v2 := m.FSType == "cgroup2"
		pids := strings.Contains(opts, ",pids,")
		if v2 {
			s, _ := cgroups.ReadFile(m.Mountpoint, "cgroup.controllers")
			pids = slices.Contains(strings.Fields(s), "pids")
		}
		out = append(out, cgroupMount{
			dir:     m.Mountpoint,
			v2:      v2,
			freezer: strings.Contains(opts, ",freezer,"),
			memory:  strings.Contains(opts, ",memory,"),
			pids:    pids,
		})
	}
	return out, nil
}

// cgroupDirs returns the directories of a cgroup path on every hierarchy
// where it exists.
func cgroupDirs(path string) ([]cgroupMount, error) {
	ms, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	return dirsIn(ms, path), nil
}

// dirsIn is cgroupDirs on hierarchies already listed, so that one Teardown
// reads the mount table once rather than at every step.
func dirsIn(ms []cgroupMount, path string) []cgroupMount {
	var out []cgroupMount
	for _, m := range ms {
		d := filepath.Join(m.dir, path)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			m.dir = d
			out = append(out, m)
		}
	}
	return out
}

// oneHierarchy picks, of a cgroup's directories, the one a listing of its
// processes reads: every process of a context is in it on every hierarchy
// (the runtime and the branch init put it there, and a context cannot
// write to cgroupfs), so one hierarchy answers; the freezer's, which
// --seal freeze moves processes in, is preferred.
func oneHierarchy(dirs []cgroupMount) []cgroupMount {
	for i, d := range dirs {
		if d.freezer || d.v2 {
			return dirs[i : i+1]
		}
	}
	if len(dirs) > 1 {
		return dirs[:1]
	}
	return dirs
}

// subdirs lists dir and every cgroup below it, parents first. A cgroup's
// directory counts its subdirectories in its link count (kernfs: two more
// than it has), so a leaf, as a branch's cgroup nearly always is, costs
// one stat instead of a read of its files (dozens on a v1 hierarchy, on
// each of a dozen hierarchies, at every abort).
func subdirs(dir string) []string {
	var st unix.Stat_t
	switch err := unix.Lstat(dir, &st); {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Nlink == 2:
		return []string{dir}
	}
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// readPids lists the processes of the cgroup dir, none if they cannot be
// read: for what is shown, not for what is killed (readPidsErr).
func readPids(dir string) []int {
	pids, _ := readPidsErr(dir)
	return pids
}

// readPidsErr lists the processes of the cgroup dir (its cgroup.procs; a
// threaded cgroup, whose cgroup.procs cannot be read, lists its threads:
// a signal to or a move of a thread acts on its whole process). A cgroup
// that is gone has none; any other failure is an error, not an empty list.
func readPidsErr(dir string) ([]int, error) {
	pids, err := cgroups.GetPids(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return pids, nil
}

// pidsIn lists the processes of a cgroup's own (its directories on every
// hierarchy), not its branches'.
func pidsIn(dirs []cgroupMount) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		for _, dir := range ownDirs(d.dir) {
			for _, pid := range readPids(dir) {
				if !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// thaw thaws a cgroup and every cgroup below it: on cgroup v1 a frozen
// task ignores SIGKILL until thawed, and a child frozen by itself stays
// frozen when its parent thaws.
func thaw(dirs []cgroupMount) {
	for _, d := range dirs {
		if !d.freezer && !d.v2 {
			continue // no freezer here: nothing to walk
		}
		for _, dir := range subdirs(d.dir) {
			_ = setFreezer(d, dir, cgroups.Thawed)
		}
	}
}

// setFreezer freezes or thaws one cgroup directory dir of the hierarchy
// m, a v1 freezer or cgroup v2, with the library's freezer: it checks the
// state the kernel reports after its write, and a freeze returns once
// frozen (at once for an empty cgroup).
func setFreezer(m cgroupMount, dir string, state cgroups.FreezerState) error {
	if m.freezer {
		return (&cgfs.FreezerGroup{}).Set(dir, &cgroups.Resources{Freezer: state})
	}
	mgr, err := fs2.NewManager(&cgroups.Cgroup{Resources: &cgroups.Resources{}}, dir)
	if err != nil {
		return err
	}
	return mgr.Freeze(state)
}

// subtreePids lists the processes in dirs and every cgroup below them; a
// list that cannot be read is an error. Not cgroups.GetAllPids, which
// reads every cgroup's directory: subdirs spares a leaf that read.
func subtreePids(dirs []cgroupMount) ([]int, error) {
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		for _, dir := range subdirs(d.dir) {
			list, err := readPidsErr(dir)
			if err != nil {
				return nil, fmt.Errorf("list processes of cgroup %s: %w", dir, err)
			}
			for _, pid := range list {
				if !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids, nil
}

// killDirs SIGKILLs every process in a cgroup (its directories on every
// hierarchy, dirs) and below it, until none is left. Processes are found by
// the kernel's accounting, so a process cannot escape by forking,
// double-forking, changing session or entering a nested PID namespace.
func killDirs(ctx context.Context, path string, dirs []cgroupMount) error {
	if len(dirs) == 0 {
		return nil
	}
	thaw(dirs)
	return killLoop(ctx, path, dirs, dirs[:1])
}

// killBranch is killDirs for a branch whose processes all live in the PID
// namespace of its init, of which initPidfd is a pidfd: the kernel kills
// the rest of the namespace as the init dies and reports the init's exit
// only once they are all gone, so that is waited for rather than polled.
// The cgroup is then checked on one hierarchy (on cgroup v2 its populated
// flag covers the subtree in one read), not on all of them as killDirs
// does; only a process put into it from outside the namespace could be
// elsewhere, and release kills those before it removes the cgroup. frozen
// says the shim froze the branch or a part of it, which is thawed first:
// a frozen task on cgroup v1 ignores SIGKILL.
func killBranch(ctx context.Context, path string, dirs []cgroupMount, initPidfd int, frozen bool) error {
	if len(dirs) == 0 {
		return nil
	}
	if frozen {
		thaw(dirs)
	}
	if err := signalAll(ctx, dirs); err == nil && waitExit(initPidfd, time.Now().Add(100*time.Millisecond)) && !populated(dirs) {
		return nil
	} else if err != nil {
		log.G(ctx).WithError(err).WithField("cgroup", path).Warn("kill branch processes at once; killing them one by one")
	}
	// The init is not gone (frozen by someone else?), something outside
	// its namespace is in the cgroup, or the kill at once failed: the slow
	// way, which fails unless the cgroup is seen empty.
	return killDirs(ctx, path, dirs)
}

// signalAll kills every process of a cgroup once: all at once where
// cgroup.kill exists (cgroup v2, Linux 5.14), one by one on the first v1
// hierarchy.
func signalAll(ctx context.Context, dirs []cgroupMount) error {
	if err := killV2(dirs); err != nil {
		return err
	}
	if !dirs[0].v2 {
		pids, err := subtreePids(dirs[:1])
		if err != nil {
			return err
		}
		killPids(ctx, pids)
	}
	return nil
}

// killV2 writes cgroup.kill (Linux 5.14) on the v2 directories of dirs,
// which kills each whole subtree atomically. A kernel without it (no such
// file) is left to the kill one by one; any other failure (a threaded
// cgroup refuses it) is an error.
func killV2(dirs []cgroupMount) error {
	var errs []error
	for _, d := range dirs {
		if !d.v2 {
			continue
		}
		// cgroups.WriteFile, as it does not create: os.WriteFile's
		// O_CREAT makes a missing file EACCES, not ENOENT.
		err := cgroups.WriteFile(d.dir, "cgroup.kill", "1")
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("kill cgroup %s: %w", d.dir, err))
		}
	}
	return errors.Join(errs...)
}

func killPids(ctx context.Context, pids []int) {
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			log.G(ctx).WithError(err).WithField("pid", pid).Warn("kill branch process")
		}
	}
}

// populated says whether a cgroup or one below it holds a process, as its
// v2 directory's cgroup.events says, or else the first v1 hierarchy.
func populated(dirs []cgroupMount) bool {
	for _, d := range dirs {
		if !d.v2 {
			continue
		}
		s, err := cgroups.ReadFile(d.dir, "cgroup.events")
		if err != nil {
			break
		}
		return !strings.Contains(s, "populated 0")
	}
	pids, err := subtreePids(dirs[:1])
	return err != nil || len(pids) > 0 // unreadable: maybe populated
}

// killLoop kills the processes of dirs until none is left, watching the
// hierarchies of watch while they die and checking all before it returns.
func killLoop(ctx context.Context, path string, dirs, watch []cgroupMount) error {
	if err := killV2(dirs); err != nil {
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
		pids, err := subtreePids(watch)
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
		killPids(ctx, pids)
		time.Sleep(delay)
		if delay < 10*time.Millisecond {
			delay *= 2
		}
	}
}

// waitExit waits until the process of pidfd has exited, or deadline, and
// says whether it has.
func waitExit(pidfd int, deadline time.Time) bool {
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

// removeDirs removes a cgroup (its directories on every hierarchy) and its
// descendants, deepest first. Its processes must be gone.
func removeDirs(dirs []cgroupMount) error {
	var errs []error
	for _, d := range dirs {
		list := subdirs(d.dir)
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

// freezeOwn freezes the processes that are directly in a cgroup path (not
// its children's, which are branches) by moving them into a child leaf
// (sealLeaf) and freezing that; the freeze is done once the kernel says
// so. On cgroup v2 they come from the leaf they live in once the context
// has branches (ownLeaf), into which an exec into the context still goes,
// unfrozen, as one into the context's own cgroup does on v1.
func freezeOwn(ctx context.Context, path string) error {
	dirs, err := cgroupDirs(path)
	if err != nil {
		return err
	}
	v2 := cgroups.IsCgroup2UnifiedMode()
	if v2 {
		if err := prepareBranchParent(ctx, path); err != nil {
			return fmt.Errorf("freeze %s: %w", path, err)
		}
	}
	for _, d := range dirs {
		if !(d.freezer || (v2 && d.v2)) {
			continue
		}
		from := d.dir
		if v2 {
			from = filepath.Join(d.dir, ownLeaf)
		}
		leaf := filepath.Join(d.dir, sealLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("freeze %s: make leaf cgroup: %w", path, err)
		}
		// The leaf starts thawed; it is frozen first so moved processes
		// stop the moment they arrive.
		if err := setFreezer(d, leaf, cgroups.Frozen); err != nil {
			return fmt.Errorf("freeze %s: %w", path, err)
		}
		if v2 {
			// A process left out would run on: a failed move fails the
			// freeze.
			if err := moveAll(from, leaf); err != nil {
				return fmt.Errorf("freeze %s: %w", path, err)
			}
			// One that got into the context's own cgroup before its
			// controllers were enabled.
			if err := moveAll(d.dir, leaf); err != nil {
				return fmt.Errorf("freeze %s: %w", path, err)
			}
		} else {
			// Repeat: a process can fork while the others are being moved.
			for i := 0; i < 100; i++ {
				pids := readPids(from)
				if len(pids) == 0 {
					break
				}
				for _, pid := range pids {
					if err := cgroups.WriteCgroupProc(leaf, pid); err != nil && !errors.Is(err, unix.ESRCH) {
						log.G(ctx).WithError(err).WithField("pid", pid).Warn("move process to seal cgroup")
					}
				}
			}
		}
		if err := waitFrozen(d, leaf); err != nil {
			return fmt.Errorf("freeze %s: %w", path, err)
		}
	}
	return nil
}

// waitFrozen waits until the kernel says the cgroup dir of hierarchy m is
// frozen: FROZEN in its v1 freezer.state, frozen 1 in its v2
// cgroup.events. Not the library's freeze: on v1 it thaws and refreezes a
// cgroup slow to freeze (letting sealed processes run), on v2 it polls
// every 10ms, a sleep nearly every seal would pay.
func waitFrozen(m cgroupMount, dir string) error {
	file, want := "freezer.state", "FROZEN"
	if !m.freezer {
		file, want = "cgroup.events", "frozen 1"
	}
	for i := 0; i < 2000; i++ {
		s, err := cgroups.ReadFile(dir, file)
		if err != nil {
			return err
		}
		if slices.Contains(strings.Split(s, "\n"), want) {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("%s has no %q after 2s: %w", filepath.Join(dir, file), want, errdefs.ErrUnavailable)
}

// ThawSealForKill thaws the seal leaf of a sandbox being killed, so that
// the signal lands; its processes stay in the leaf, where the sandbox's
// end finds them.
func (c *Service) ThawSealForKill(ctx context.Context, id string) {
	sb, err := c.Sandbox(id)
	if err != nil || sb.cgroup == "" {
		return
	}
	ms, err := c.hier()
	if err != nil {
		return
	}
	for _, d := range dirsIn(ms, sb.cgroup) {
		leaf := filepath.Join(d.dir, sealLeaf)
		if (d.freezer || d.v2) && isDir(leaf) {
			if err := setFreezer(d, leaf, cgroups.Thawed); err != nil {
				log.G(ctx).WithError(err).WithField("sandbox", id).Warn("thaw the sealed processes of a killed sandbox")
			}
		}
	}
}

// thawOwn undoes freezeOwn: the processes go back to the context's cgroup
// (on cgroup v2 its leaf).
func thawOwn(ctx context.Context, path string) error {
	dirs, err := cgroupDirs(path)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		leaf := filepath.Join(d.dir, sealLeaf)
		if _, err := os.Stat(leaf); err != nil {
			continue
		}
		to := d.dir
		if d.v2 && isDir(filepath.Join(d.dir, ownLeaf)) {
			to = filepath.Join(d.dir, ownLeaf)
		}
		if d.freezer || d.v2 {
			_ = setFreezer(d, leaf, cgroups.Thawed)
		}
		// Thawed, they fork again: a child made while its parent was
		// moved starts in the leaf, so it is read until empty.
		for try := 0; try < 20; try++ {
			pids := readPids(leaf)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				if err := cgroups.WriteCgroupProc(to, pid); err != nil && !errors.Is(err, unix.ESRCH) {
					log.G(ctx).WithError(err).WithField("pid", pid).Warn("move process back from seal cgroup")
				}
			}
		}
		if err := unix.Rmdir(leaf); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove seal cgroup %s: %w", leaf, err))
		}
	}
	return errors.Join(errs...)
}

// oomKillsIn is how many processes the kernel's OOM killer killed in a
// cgroup itself, not in its branches below it (its directories on every
// hierarchy): memory.oom_control on v1, which counts its own; on v2,
// where memory.events counts descendants too, memory.events.local of the
// cgroup and of its leaf.
func oomKillsIn(dirs []cgroupMount) uint64 {
	for _, d := range dirs {
		switch {
		case d.memory:
			if n, ok := oomKillLine(d.dir, "memory.oom_control"); ok {
				return n
			}
		case d.v2:
			var sum uint64
			found := false
			for _, dir := range ownDirs(d.dir) {
				if n, ok := oomKillLine(dir, "memory.events.local"); ok {
					sum, found = sum+n, true
				}
			}
			if found {
				return sum
			}
		}
	}
	return 0
}

// oomKillLine reads the oom_kill line of a memory controller's file of
// the cgroup dir. Not fscommon.GetValueByKey, which reads a file without
// the line as 0.
func oomKillLine(dir, file string) (uint64, bool) {
	s, err := cgroups.ReadFile(dir, file)
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(s, "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, true
		}
	}
	return 0, false
}
