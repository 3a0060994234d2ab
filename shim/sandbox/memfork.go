//go:build linux

package sandbox

// Memory forks (docs/memory-fork.md): a branch whose processes are a copy
// of its parent's, restored with CRIU from one dump of the parent's init
// and its descendants, taken after the parent is sealed, so that the
// memory image and the branch's lower layer are the same instant.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/containerd/errdefs"
	runcC "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/internal/procfd"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/ocirt"
)

// CriuBinary is the name of the CRIU binary, looked for beside the shim
// first, then on PATH.
const CriuBinary = "criu"

// memoryImagePrefix names, in a sandbox's bundle, the directory a memory
// fork dumps into; it is removed when the fork is done, and any left by a
// shim killed midway is removed by the next memory fork and by the
// sandbox's deletion (the bundle goes).
const memoryImagePrefix = ".memory-fork-"

// memoryImage is one dump of a branch's processes, restored into each
// branch of the fork.
type memoryImage struct {
	dir   string
	pause time.Duration // how long CRIU kept the processes stopped
	dump  time.Duration // the dump's whole time, as the caller waits for it
	size  int64
	kept  bool // a checkpoint's, which the snapshotter keeps: not removed
}

// criuPath finds CRIU: beside the shim (make install puts it there), or on
// the PATH the shim was started with.
func criuPath(self string) (string, error) {
	p := filepath.Join(filepath.Dir(self), CriuBinary)
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return p, nil
	}
	return exec.LookPath(CriuBinary)
}

// checkMemoryFork refuses, before anything changes, a memory fork that
// could not be restored, naming the process and the resource.
func (c *Service) checkMemoryFork(ctx context.Context, sb *Sandbox, parent *Branch, initPid int, req *shimv1.ForkRequest) error {
	what := fmt.Sprintf("memory fork of %s", sb.id)
	if parent.id != branch.RootID {
		what = fmt.Sprintf("memory fork of branch %s of %s", parent.id, sb.id)
	}
	if len(req.Args) > 0 {
		return fmt.Errorf("%s: a command: the branches' processes are the parent's, restored; exec the command into them: %w", what, errdefs.ErrInvalidArgument)
	}
	if req.FromCheckpoint != "" {
		// The image was checked when the checkpoint was taken, from
		// outside the sandbox: no caller of the branch socket is in it.
		if _, err := criuPath(c.self); err != nil {
			return c.noCriu(what)
		}
		return nil
	}
	return c.checkMemoryDump(ctx, sb, parent, initPid, what, req.Net != NetIsolated, int(req.Count), req.Limits.GetMemory())
}

// checkMemoryDump refuses, before anything changes, a dump of a branch's
// processes that could not be restored, naming the process and the
// resource; what names the operation.
//
// copies is how many copies of the processes are restored at once (a
// fork's count; 0 for a checkpoint), each under a memory limit of
// branchLimit if it is not 0.
func (c *Service) checkMemoryDump(ctx context.Context, sb *Sandbox, parent *Branch, initPid int, what string, sharedNet bool, copies int, branchLimit int64) error {
	if isSelfFork(ctx) && selfCallToken(ctx) == "" && !callerApart(ctx) {
		// The caller is one of the processes to copy, stopped in a call
		// on the branch socket, whose connection a restored copy cannot
		// be given. (A call on the caller's own branch is made after
		// the call instead: selfcall.go.)
		return fmt.Errorf("%s: asked for from inside the sandbox, whose caller's connection to the branch socket cannot be copied; ask for it from outside (branchctl), or fork --from a checkpoint taken with memory: %w", what, errdefs.ErrNotImplemented)
	}
	c.insock.mu.Lock()
	sock := c.insock.socks[selfKey(sb.id, parent.id)]
	c.insock.mu.Unlock()
	if sock != nil {
		if n, _ := sock.conns.count(); n > 0 {
			return fmt.Errorf("%s: %d connection(s) to its branch socket are open (a `branchctl self` call of one of its processes), which a copy could not be given: %w", what, n, errdefs.ErrFailedPrecondition)
		}
	}
	if parent.id != branch.RootID && parent.container == nil {
		return fmt.Errorf("%s: it runs on the branch init, whose control connection to the shim cannot be restored; only a branch made by a memory fork can be dumped: %w", what, errdefs.ErrNotImplemented)
	}
	if joined := sharedWithUserNS(parent.spec); joined != "" {
		// CRIU restores the processes in a new user namespace with the
		// same mappings (restoredUserNS), from which the kernel refuses
		// it a namespace owned by the parent's: refused before the dump
		// stops anything.
		return fmt.Errorf("%s: it runs in a user namespace and joins the %s namespace of another process (a pod's), which CRIU cannot join from the user namespace it restores into; fork it without --memory (docs/userns.md): %w", what, joined, errdefs.ErrNotImplemented)
	}
	if shared := sharedPidNS(parent.spec); shared != "" {
		// CRIU restores a tree into a PID namespace of its own, whose
		// init is the tree's first process: it refuses to dump one
		// whose namespace's init is not in the tree, after stopping it.
		return fmt.Errorf("%s: its processes are in a PID namespace that is not theirs, %s, whose init is not one of them; CRIU restores a process tree only as a PID namespace of its own: fork it without --memory: %w", what, shared, errdefs.ErrNotImplemented)
	}
	if parent.spec != nil && parent.spec.Process != nil && parent.spec.Process.Terminal {
		return fmt.Errorf("%s: its init holds a terminal whose other end is on the host (ctr run -t, nerdctl -t), which a restored copy cannot be given: %w", what, errdefs.ErrFailedPrecondition)
	}
	if _, err := criuPath(c.self); err != nil {
		return c.noCriu(what)
	}
	ms, err := c.cgroups.Mounts()
	if err != nil {
		return err
	}
	var own []int
	for _, d := range cgroup.OneHierarchy(cgroup.DirsIn(ms, parent.cgroup)) {
		for _, dir := range cgroup.OwnDirs(d.Path) {
			own = append(own, cgroup.ReadPids(dir)...)
		}
	}
	// One walk of the tree serves every check.
	tree := procfd.Tree(initPid, nil)
	problems, ghosts, locks := unforkable(initPid, tree, own, sharedNet)
	problems = append(problems, sharedLocks(initPid, locks, parent.spec)...)
	problems = append(problems, nestedNamespaces(initPid, tree)...)
	if len(problems) > 0 {
		return fmt.Errorf("%s: %s: %w", what, strings.Join(problems, "; "), errdefs.ErrFailedPrecondition)
	}
	anon := treeAnon(tree)
	if err := checkImageRoom(sb.bundle, anon+ghosts, what); err != nil {
		return err
	}
	if copies > 0 {
		return checkMemoryRoom(ms, parent.cgroup, branchName(parent.id), anon, copies, branchLimit, what)
	}
	return nil
}

func (c *Service) noCriu(what string) error {
	return fmt.Errorf("%s: CRIU is not installed beside the shim (%s) or on its PATH (make install puts it there; docs/memory-fork.md): %w", what, filepath.Join(filepath.Dir(c.self), CriuBinary), errdefs.ErrFailedPrecondition)
}

// dumpMemory dumps the parent's processes, leaving them running (or as
// frozen as they were), into a new directory of the sandbox's bundle.
func (c *Service) dumpMemory(ctx context.Context, sb *Sandbox, parent *Branch, what string) (*memoryImage, error) {
	c.removeMemoryImages(ctx, sb)
	dir, err := os.MkdirTemp(sb.bundle, memoryImagePrefix)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	img := &memoryImage{dir: dir}
	ms, err := c.cgroups.Mounts()
	if err != nil {
		img.remove(ctx)
		return nil, err
	}
	// Processes the seal froze are dumped from their frozen cgroup (CRIU
	// thaws them under ptrace and refreezes them); running ones are
	// stopped with ptrace alone, which CRIU's freezer path would pay a
	// 100ms poll for.
	freeze := ""
	if parent.state.has(sealFrozen) {
		for _, d := range cgroup.DirsIn(ms, parent.cgroup) {
			if d.Freezer || (d.V2 && cgroups.IsCgroup2UnifiedMode()) {
				freeze = filepath.Join(d.Path, cgroup.SealLeaf)
				break
			}
		}
	}
	runtimeID := sb.id
	if parent.container != nil {
		runtimeID = parent.runtimeID
	}
	r := c.runtimeOf(sb)
	// An image for this runtime's restores only, each joining the network
	// namespace it is given.
	opts := &runcC.CheckpointOpts{ImagePath: dir, WorkDir: dir, ExtraArgs: []string{"--" + ocirt.MemoryForkFlag}}
	if freeze != "" {
		opts.ExtraArgs = append(opts.ExtraArgs, "--freeze-cgroup", freeze)
	}
	start := time.Now()
	// Not cut short when the caller gives up: a runtime killed midway
	// leaves CRIU (its child, which nothing kills with it) dumping on;
	// the fork undoes the whole branch instead.
	err = r.Checkpoint(context.WithoutCancel(ctx), runtimeID, opts, runcC.LeaveRunning)
	img.dump = time.Since(start)
	if err != nil {
		why := criuErrors(err, filepath.Join(dir, "dump.log"))
		img.remove(ctx)
		return nil, c.dumpFailed(ctx, sb, parent, what, err, why)
	}
	if err := markSelfCall(ctx, dir); err != nil {
		img.remove(ctx)
		return nil, fmt.Errorf("%s: record its caller in the image: %w", what, err)
	}
	if f, err := os.Open(dir); err == nil {
		if st, err := stats.CriuGetDumpStats(f); err == nil {
			img.pause = time.Duration(st.GetFrozenTime()+st.GetFreezingTime()) * time.Microsecond
		}
		f.Close()
	}
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				img.size += fi.Size()
			}
		}
		return nil
	})
	log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "branch": parent.id, "pause": img.pause, "dump": img.dump, "bytes": img.size}).Debug("memory fork: dumped")
	return img, nil
}

// runtimeOf is the runtime command line the sandbox's containers are run
// with (containerd's runc-v2 derives it the same way).
func (c *Service) runtimeOf(sb *Sandbox) *runcC.Runc {
	root, systemd := DefaultRoot, false
	if sb.opts != nil {
		if sb.opts.Root != "" {
			root = sb.opts.Root
		}
		systemd = sb.opts.SystemdCgroup
	}
	return process.NewRunc(root, sb.bundle, sb.ns, c.runtime, systemd)
}

// remove removes the image.
func (img *memoryImage) remove(ctx context.Context) {
	if img == nil || img.kept {
		return
	}
	if err := os.RemoveAll(img.dir); err != nil {
		log.G(ctx).WithError(err).WithField("dir", img.dir).Warn("remove memory fork image")
	}
}

// removeMemoryImages removes the images of memory forks a killed shim left
// in the sandbox's bundle.
func (c *Service) removeMemoryImages(ctx context.Context, sb *Sandbox) {
	removeMemoryImages(ctx, sb.bundle)
}

// removeMemoryImages removes the memory fork images in a bundle: those of a
// killed shim, which containerd's cleanup of it (shim/shim.go) does not find.
func removeMemoryImages(ctx context.Context, bundle string) {
	left, _ := filepath.Glob(filepath.Join(bundle, memoryImagePrefix+"*"))
	for _, d := range left {
		(&memoryImage{dir: d}).remove(ctx)
	}
}

// killCriuOf kills the CRIU processes working on a bundle's memory fork
// images (they hold the image directory open) and waits for them to end:
// a runtime killed with its shim leaves CRIU running, dumping or restoring
// into cgroups and state that the dead shim's cleanup would remove too
// early.
func killCriuOf(ctx context.Context, bundle string) {
	// containerd may have renamed the bundle to .ID already, on its way
	// to removing it.
	dirs := []string{bundle + "/", filepath.Join(filepath.Dir(bundle), "."+filepath.Base(bundle)) + "/"}
	under := func(p string) bool {
		for _, d := range dirs {
			if strings.HasPrefix(p, d) {
				return true
			}
		}
		return false
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || comm(pid) != CriuBinary {
			continue
		}
		// Its working directory is the dump's image directory or the
		// restore's work directory, both in the bundle; it holds the
		// image directory open.
		links := []string{fmt.Sprintf("/proc/%d/cwd", pid)}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			links = append(links, fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		}
		for _, l := range links {
			if p, err := os.Readlink(l); err == nil && under(p) {
				pids = append(pids, pid)
				break
			}
		}
	}
	for _, pid := range pids {
		log.G(ctx).WithField("pid", pid).Warn("killing the CRIU of a memory fork its shim left")
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	// Within containerd's cleanup timeout (5s) with the rest of it.
	deadline := time.Now().Add(2 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) && alive(pid) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// dumpFailed is the error of a dump of parent's processes that failed
// with err, CRIU's error lines being why.
func (c *Service) dumpFailed(ctx context.Context, sb *Sandbox, parent *Branch, what string, err error, why string) error {
	if c.initEnded(ctx, sb, parent) {
		// Killed meanwhile: CRIU's and the runtime's words ("cannot be
		// checkpointed in stopped state", an RLIMIT warning) would hide
		// it.
		hint := ""
		if !parent.state.has(sealFrozen) {
			// What ended it, most often (a Node.js app dies of the
			// EROFS of its next write), and what avoids it.
			hint = " (the fork had sealed its root filesystem read-only: a process whose write to it fails may end; --seal freeze stops its processes instead while it has branches)"
		}
		return fmt.Errorf("%s: %s's init exited during the dump of its processes%s; nothing was made: %w", what, branchName(parent.id), hint, errdefs.ErrFailedPrecondition)
	}
	if strings.Contains(err.Error()+why, "No space left on device") {
		// The estimate before the dump was short (checkImageRoom).
		err = fmt.Errorf("%w: its image did not fit in the sandbox's bundle, in containerd's state directory: %w", err, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("%s: dump its processes: %w%s", what, err, why)
}

// initEnded says whether branch n's init is gone (or a zombie): a
// failure meanwhile was its end's, not its own.
func (c *Service) initEnded(ctx context.Context, sb *Sandbox, n *Branch) bool {
	pid, err := c.initPid(ctx, sb, n)
	return err != nil || !alive(pid)
}

// alive says whether a process still runs: a zombie (an orphan waiting
// for the host's init to reap it) does not, nor one on its way out
// (PF_EXITING): it has let go of its namespaces before it turns zombie, and
// a dump that came then failed on "net namespace of the init: no such
// file or directory" (TestMemoryForkKillDuringFork).
func alive(pid int) bool {
	st, err := procfd.ReadStat(pid)
	return err == nil && st.State != 'Z' && st.State != 'X' && st.Flags&procfd.Exiting == 0
}

// criuErrors is what CRIU's log says went wrong, unless err (the
// runtime's) says it already.
func criuErrors(err error, logPath string) string {
	if err != nil && strings.Contains(err.Error(), ocirt.CriuLogMarker) {
		return ""
	}
	return ocirt.CriuLogErrors(logPath)
}

// checkpointImage is the memory image kept by checkpoint name of the
// parent, to restore branches from. It is restored from where the
// snapshotter keeps it: CRIU opens its files after entering the branch's
// mount namespace, where a link to them would not lead (and a copy would
// cost as much as the dump); a restore writes only its statistics
// (stats-restore) there.
func (c *Service) checkpointImage(ctx context.Context, sb *Sandbox, parent *Branch, name string, copies int, branchLimit int64) (*memoryImage, error) {
	what := fmt.Sprintf("memory fork of %s from checkpoint %q", sb.id, name)
	ck, err := c.checkpointNamed(ctx, sb, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if ck.Branch != parent.id {
		return nil, fmt.Errorf("%s: it is a state of branch %s, not of %s: %w", what, ck.Branch, parent.id, errdefs.ErrInvalidArgument)
	}
	img, err := keptImage(what, ck)
	if err != nil {
		return nil, err
	}
	// Its copies are charged as a live fork's are; the image's size
	// stands for the memory it restores.
	ms, err := c.cgroups.Mounts()
	if err != nil {
		return nil, err
	}
	if err := checkMemoryRoom(ms, parent.cgroup, branchName(parent.id), img.size, copies, branchLimit, what); err != nil {
		return nil, err
	}
	return img, nil
}

// keptImage is the memory image checkpoint ck keeps.
func keptImage(what string, ck branch.Checkpoint) (*memoryImage, error) {
	if ck.MemoryBytes == 0 || ck.MemoryDir == "" {
		return nil, fmt.Errorf("%s: it holds files only (taken without --memory); fork --from it without --memory, or take a checkpoint with --memory: %w", what, errdefs.ErrFailedPrecondition)
	}
	if fi, err := os.Stat(filepath.Join(ck.MemoryDir, "inventory.img")); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: its memory image is not where the snapshotter keeps it (%v): %w", what, err, errdefs.ErrDataLoss)
	}
	return &memoryImage{dir: ck.MemoryDir, size: ck.MemoryBytes, kept: true}, nil
}

// checkpointMemory takes checkpoint name of branch n with its processes:
// they are frozen (if a seal has not already), dumped, and the rootfs is
// checkpointed before they go on, so that image and files are one instant.
func (c *Service) checkpointMemory(ctx context.Context, sb *Sandbox, n *Branch, name string) (_ branch.Checkpoint, retErr error) {
	what := fmt.Sprintf("checkpoint %q of %s with memory", name, sb.id)
	if n.id != branch.RootID {
		what = fmt.Sprintf("checkpoint %q of branch %s of %s with memory", name, n.id, sb.id)
	}
	if n.state.has(held) {
		return branch.Checkpoint{}, fmt.Errorf("%s: it is frozen until the snapshotter says whether its commit was made; call commit again to learn it: %w", what, errdefs.ErrFailedPrecondition)
	}
	if err := sb.checkBoundsBefore(ctx); err != nil {
		return branch.Checkpoint{}, err
	}
	pid, err := c.initPid(ctx, sb, n)
	if err != nil {
		return branch.Checkpoint{}, err
	}
	// Its image may be restored into branches sharing the network
	// namespace: its ports are checked as for such a fork.
	if err := c.checkMemoryDump(ctx, sb, n, pid, what, true, 0, 0); err != nil {
		return branch.Checkpoint{}, err
	}
	if !n.state.has(sealFrozen) {
		if err := cgroup.FreezeOwn(ctx, n.cgroup); err != nil {
			return branch.Checkpoint{}, fmt.Errorf("%s: freeze its processes: %w", what, err)
		}
		n.state.set(sealFrozen)
		defer func() {
			n.state.clear(sealFrozen)
			if err := cgroup.ThawOwn(ctx, n.cgroup); err != nil {
				log.G(ctx).WithError(err).WithField("branch", n.id).Error("thaw after a checkpoint with memory")
				if retErr == nil {
					retErr = fmt.Errorf("%s: taken, but its processes could not all be thawed: %w", what, err)
				}
			}
		}()
	}
	img, err := c.dumpMemory(ctx, sb, n, what)
	if err != nil {
		return branch.Checkpoint{}, err
	}
	defer img.remove(context.WithoutCancel(ctx))
	// Taken whatever the caller does meanwhile: the processes stay frozen
	// only until it returns.
	return sb.snapshot.Checkpoint(context.WithoutCancel(ctx), sb.ref(n.id), name, branch.WithMemoryImage(img.dir), sb.checkpointBounds())
}

// rollbackMemory brings branch n back to checkpoint ck, which holds its
// processes: they are killed, its rootfs is rolled back, and the
// checkpoint's processes are restored in their place, in the same bundle,
// cgroup and network namespace. If the restore fails the branch keeps the
// checkpoint's files with no process running (commit or abort it).
func (c *Service) rollbackMemory(ctx context.Context, sb *Sandbox, n *Branch, ck branch.Checkpoint) error {
	what := fmt.Sprintf("rollback of branch %s of %s to %q", n.id, sb.id, ck.Name)
	if err := c.checkRollbackMemory(sb, n, ck, what); err != nil {
		return err
	}
	img, err := keptImage(what, ck)
	if err != nil {
		return err
	}
	// From here on it is carried through whatever the caller does: a
	// branch left between its old processes and its new ones is no use.
	ctx = context.WithoutCancel(ctx)
	ms, err := c.cgroups.Mounts()
	if err != nil {
		return err
	}
	dirs := cgroup.DirsIn(ms, n.cgroup)
	if err := cgroup.KillDirs(ctx, n.cgroup, dirs); err != nil {
		return fmt.Errorf("%s: kill its processes: %w", what, err)
	}
	sb.keepEnded(n.id, n.container.ExecdProcesses())
	old := c.detach(ctx, n).(*runc.Container)
	// Waited for: the old init's delete unmounts <bundle>/rootfs, where
	// the restore mounts the branch's rootfs again.
	dropped := make(chan struct{})
	c.dropRuntimeState(ctx, sb, n, old, dirs, func() { close(dropped) })
	<-dropped
	n.state.set(exited) // until the restore below runs its processes again
	if err := sb.snapshot.Rollback(ctx, sb.ref(n.id), ck.Name, branch.WithProcesses()); err != nil {
		return fmt.Errorf("%s: its processes were ended: %w", what, err)
	}
	mounts, err := sb.snapshot.Mounts(ctx, sb.ref(n.id))
	if err != nil {
		return fmt.Errorf("%s: its files are the checkpoint's, its processes were ended: %w", what, err)
	}
	n.memory = true
	if err := c.runOnRuntime(ctx, sb, n, mounts, img, nil); err != nil {
		if root := sb.nodes[branch.RootID]; root != nil && c.initEnded(ctx, sb, root) {
			// The restore joins the sandbox's namespaces: its failure
			// says only that a /proc path is gone.
			return fmt.Errorf("%s: the sandbox's init exited during the rollback; the branch ends with it: %w", what, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("%s: its files are the checkpoint's, but %w", what, err)
	}
	n.state.clear(exited)
	return nil
}

// checkRollbackMemory refuses, before anything changes, a rollback of
// branch n with its processes to ck that could not be done: what names it.
func (c *Service) checkRollbackMemory(sb *Sandbox, n *Branch, ck branch.Checkpoint, what string) error {
	if c.Paused(sb) {
		return PausedError(sb)
	}
	if n.state.has(held) {
		return fmt.Errorf("%s: it is frozen until the snapshotter says whether its commit was made; call commit again to learn it: %w", what, errdefs.ErrFailedPrecondition)
	}
	if ck.Branch != n.id {
		return fmt.Errorf("%s: it is a state of branch %s: %w", what, ck.Branch, errdefs.ErrInvalidArgument)
	}
	var kids []string
	for _, o := range sb.nodes {
		if o.parent == n.id && o.id != branch.RootID {
			kids = append(kids, o.id)
		}
	}
	if len(kids) > 0 {
		sort.Strings(kids)
		return fmt.Errorf("%s: it has %d live children (%s) built on its current state; commit or abort them first: %w", what, len(kids), strings.Join(kids, ", "), errdefs.ErrFailedPrecondition)
	}
	return nil
}
