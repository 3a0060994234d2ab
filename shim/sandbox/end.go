//go:build linux

package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// destroy kills every process of a branch (and of any branch nested in
// it), then removes its init, its rootfs mount, cgroup and bundle.
func (c *Service) destroy(ctx context.Context, sb *Sandbox, n *Branch) {
	c.destroyAll(ctx, sb, []*Branch{n}, nil)()
}

// destroyAll destroys branches together: their processes are all killed
// first, so that none of them runs on while another is taken down. It
// returns once they are dead, which is all the snapshotter needs before it
// commits or discards their layers, and all a caller needs before it
// replies: nothing of the branches runs any more. whileDying, if not nil,
// runs once every process has been sent its SIGKILL, while they die: work
// that needs only that they never run again (the snapshotter's discard of
// their layers) overlaps the wait for their exits. The rest (runtime
// state, cgroups, rootfs mounts and the references held to them, bundles)
// goes on in the background, counted in sb.releasing; the returned wait
// blocks until it is done.
func (c *Service) destroyAll(ctx context.Context, sb *Sandbox, ns []*Branch, whileDying func()) (wait func()) {
	ms, err := c.cgroups.Mounts()
	if err != nil {
		log.G(ctx).WithError(err).Error("list cgroup hierarchies")
	}
	var live []*Branch
	for _, n := range ns {
		if n.procs() != nil {
			live = append(live, n)
		}
	}
	refs := make([]*os.File, 0, 2*len(live))
	for _, n := range live {
		rootfs := n.rootfs
		if rootfs == nil {
			// One started before its rootfs was held, or run by the
			// runtime (a memory fork's restore), whose detach unmounts
			// the host's mount before its release.
			rootfs = holdRootfs(filepath.Join(n.bundle, "rootfs"))
		}
		refs = append(refs, n.mntns, rootfs)
		n.rootfs, n.mntns = nil, nil
	}
	dirs := killAll(ctx, ms, live, whileDying)
	containers := make([]branchProcs, len(live))
	for i, n := range live {
		switch {
		case n.init != nil:
			sb.keepEnded(n.id, n.init.Execd())
		case n.container != nil:
			sb.keepEnded(n.id, n.container.ExecdProcesses())
		}
		containers[i] = c.detach(ctx, n)
		// An isolated memory branch's network namespace goes with its
		// processes, before the reply, as its rootfs mount does.
		detachNetns(ctx, n.bundle)
	}
	done := make(chan struct{})
	sb.releasing.Add(1)
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer sb.releasing.Done()
		defer close(done)
		for i, n := range live {
			c.release(ctx, sb, n, containers[i], dirs[i])
		}
		for _, f := range refs {
			if f != nil {
				f.Close() // the overlay's end, and its sync, if last
			}
		}
	}()
	return func() { <-done }
}

// holdRootfs takes a reference to the rootfs mount at path (nil if there
// is none), which a branch keeps until destroyAll drops it last, in the
// background of its release. The overlay's superblock ends
// with its last reference, and the kernel then syncs the whole filesystem
// of its upper (overlayfs's sync_fs writes back every dirty page there,
// the node's other containers' too), which on a busy node takes seconds.
// Without it the last reference was the init's mount namespace or the
// snapshotter's detach of the host mount, both on the abort's path (and
// on a commit's, for its losers): an abort took 210-280 ms instead of
// 9-12 with 512 MB written but not yet written back on the node
// (TestAbortNotBehindWriteback).
func holdRootfs(path string) *os.File {
	f, err := os.OpenFile(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return f
}

// pidfdGetMntNamespace is PIDFD_GET_MNT_NAMESPACE (linux/pidfd.h, Linux
// 6.11): a descriptor of the mount namespace of a pidfd's process.
const pidfdGetMntNamespace = 0xFF03

// holdMntns takes a reference to the mount namespace of a branch's init
// (nil if it cannot), which destroyAll drops with the rootfs's. A mount
// namespace ends with its last process otherwise: its mounts are
// unmounted and the exit waits for an RCU grace period
// (synchronize_rcu_expedited, 70 us and more when grace periods queue up),
// which the abort waits for in turn.
func holdMntns(init *initdriver.Process) *os.File {
	pidfd := init.DupPidfd()
	if pidfd < 0 {
		return nil
	}
	defer unix.Close(pidfd)
	fd, err := unix.IoctlRetInt(pidfd, pidfdGetMntNamespace)
	if err != nil {
		return nil
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "mntns")
}

// killAll kills every process of the live branches, together, and
// returns each one's cgroup directories. Every branch is signalled first;
// whileDying (if not nil) then runs while their exits are waited for.
func killAll(ctx context.Context, ms []cgroup.Dir, live []*Branch, whileDying func()) [][]cgroup.Dir {
	dirs := make([][]cgroup.Dir, len(live))
	// A branch frozen for its children may have frozen descendants among
	// live, whose processes the kill of any of them reaches.
	frozen := false
	for _, n := range live {
		frozen = frozen || n.state.has(sealFrozen|held)
	}
	var wg sync.WaitGroup
	for i, n := range live {
		dirs[i] = cgroup.DirsIn(ms, n.cgroup)
		if n.state.has(held) && len(dirs[i]) > 0 && killHeld(ctx, n, dirs[i]) {
			continue
		}
		signalErr := cgroup.SignalBranch(ctx, dirs[i], frozen)
		pidfd := -1
		if n.init != nil {
			pidfd = n.init.Init().DupPidfd()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			kill := func() error { return cgroup.KillDirs(ctx, n.cgroup, dirs[i]) }
			if pidfd >= 0 {
				defer unix.Close(pidfd)
				kill = func() error { return cgroup.AwaitBranch(ctx, n.cgroup, dirs[i], pidfd, signalErr) }
			}
			if err := kill(); err != nil {
				log.G(ctx).WithError(err).WithField("branch", n.id).Error("kill branch processes")
			}
		}()
	}
	if whileDying != nil {
		whileDying()
	}
	wg.Wait()
	return dirs
}

// killHeld signals every process of a branch held for its commit: still
// frozen, it dies as it thaws, without running another instruction. It
// says whether that is all: the branch was frozen whole (a frozen
// cgroup's list of processes is complete, and none can fork), so nothing
// of it runs again, and its exits are waited for by release, in the
// background, rather than before the reply.
func killHeld(ctx context.Context, n *Branch, dirs []cgroup.Dir) bool {
	err := cgroup.SignalAll(ctx, dirs)
	if err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("kill held branch processes at once")
	}
	if err == nil && n.init != nil && cgroup.HeldFrozen(dirs) {
		cgroup.Thaw(dirs)
		return true
	}
	return false
}

// detach takes a branch whose processes are dead off its init and rootfs:
// it waits for the init's exit (from the shim's reaper) and unmounts the
// rootfs, after which the branch's layers are the snapshotter's alone.
func (c *Service) detach(ctx context.Context, n *Branch) branchProcs {
	container := n.procs()
	n.container, n.init = nil, nil
	if _, ok := container.(*initdriver.Branch); ok {
		// Its processes are gone from its cgroup, so they are dead: the
		// init's exit status (from the reaper) is not needed to go on.
		// Its host mount, which has nothing below it (the init mounted
		// the rest in the branch's own namespace, gone with it), goes in
		// release (releaseRootfs).
		return container
	}
	// An init that never started (a restore the sandbox's end cut short)
	// has no exit to wait for: waiting held the branch's end, and the
	// sandbox with it, for the whole 10 s. One gone already has its exit
	// from the reaper at once.
	if init, err := container.Process(""); err == nil && init.Pid() > 0 {
		limit, pid := 10*time.Second, init.Pid()
		if !alive(pid) {
			limit = 500 * time.Millisecond
		}
		wctx, cancel := context.WithTimeout(ctx, limit)
		if err := init.Wait(wctx); err != nil {
			log.G(ctx).WithError(err).WithFields(log.Fields{"branch": n.id, "pid": pid}).Warn("wait for branch init")
		}
		cancel()
	}
	if err := mount.UnmountRecursive(filepath.Join(n.bundle, "rootfs"), unix.MNT_DETACH); err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("unmount branch rootfs")
	}
	return container
}

// release removes a detached branch's runtime state and cgroups. The
// runtime state is destroyed in process (libcontainer needs no child
// process for a stopped container), which spares a run of the runtime
// binary per branch.
func (c *Service) release(ctx context.Context, sb *Sandbox, n *Branch, procs branchProcs, cgDirs []cgroup.Dir) {
	c.closeSelf(sb.id, n.id)
	if fc, ok := procs.(*initdriver.Branch); ok {
		fc.Close()
		// AwaitBranch looked at one hierarchy; a process put into the
		// cgroup from outside the branch may be in the others.
		if err := cgroup.KillLoop(ctx, n.cgroup, cgDirs, cgDirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Error("kill what is left in a branch cgroup")
		}
		if err := cgroup.RemoveDirs(cgDirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("remove branch cgroup")
		}
		unmounted := releaseRootfs(ctx, n)
		go func() {
			ctx := context.WithoutCancel(ctx)
			for _, p := range fc.Execd() {
				_ = p.Delete(ctx) // its exit came with the init's
			}
			if unmounted { // else it stays, rather than be removed through a mount
				removeBundle(ctx, n.bundle)
			}
		}()
		return
	}
	c.dropRuntimeState(ctx, sb, n, procs.(*runc.Container), cgDirs, func() {
		removeBundle(ctx, n.bundle)
	})
}

// releaseRootfs detaches the host's mount of a branch's rootfs, if the
// snapshotter's discard of its layer has not (holdRootfs keeps the
// overlay itself until the end of the release). It says whether the
// rootfs is no longer mounted, which the removal of the bundle needs.
func releaseRootfs(ctx context.Context, n *Branch) bool {
	err := unix.Unmount(filepath.Join(n.bundle, "rootfs"), unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("unmount branch rootfs")
		return false
	}
	return true
}

// dropRuntimeState removes the runtime's state and the cgroups of a
// detached branch the runtime ran; what is left (stdio copiers, exec'd
// process records) holds nothing of the branch's and goes in the
// background, followed by then.
func (c *Service) dropRuntimeState(ctx context.Context, sb *Sandbox, n *Branch, container *runc.Container, cgDirs []cgroup.Dir, then func()) {
	root := DefaultRoot
	if sb.opts != nil && sb.opts.Root != "" {
		root = sb.opts.Root
	}
	if lc, err := libcontainer.Load(filepath.Join(root, sb.ns), n.runtimeID); err == nil {
		if err := lc.Destroy(); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("destroy branch runtime state")
		}
	} else if !errors.Is(err, libcontainer.ErrNotExist) {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("load branch runtime state")
	}
	if err := cgroup.RemoveDirs(cgDirs); err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("remove branch cgroup")
	}
	go func() {
		ctx := context.WithoutCancel(ctx)
		for _, p := range container.ExecdProcesses() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := p.Wait(wctx); err == nil {
				_ = p.Delete(ctx)
			}
			cancel()
		}
		if init, err := container.Process(""); err == nil {
			_ = init.Delete(ctx) // the runtime says "does not exist"; this closes its stdio
		}
		if then != nil {
			then()
		}
	}()
}

// unsealIfIdle thaws a branch frozen for its children when it has none.
func (c *Service) unsealIfIdle(ctx context.Context, sb *Sandbox, n *Branch) {
	for _, o := range sb.nodes {
		if o.parent == n.id && o.id != branch.RootID {
			return
		}
	}
	if n.state.has(sealFrozen) {
		if err := cgroup.ThawOwn(ctx, n.cgroup); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Error("thaw sealed branch")
		}
		n.state.clear(sealFrozen)
	}
	n.seal = SealReadOnly
}
