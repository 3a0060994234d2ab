//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/branchbox/branchbox/client/branchapi"
	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/initdriver"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	runcC "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runc/libcontainer"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// The life of a sandbox's contexts: a sandbox added and prepared, a branch
// started (by a branch init or the runtime), destroyed and released, and
// every branch ended with its sandbox.

// AddSandbox records a container as it is created; its rootfs mounts name
// its snapshot.
func (c *Service) AddSandbox(ctx context.Context, r *taskAPI.CreateTaskRequest, opts *options.Options, b bounds) {
	ns, _ := namespaces.Namespace(ctx)
	upper := ""
	for _, m := range r.Rootfs {
		for _, o := range m.Options {
			if u, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = u
			}
		}
	}
	cgPath := ""
	if spec, err := ReadSpec(r.Bundle); err == nil && spec.Linux != nil {
		// Not resolvable: no cgroup of its own to look at (prepare
		// refuses its branches and says why).
		cgPath, _ = cgroup.SandboxPath(spec.Linux.CgroupsPath)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.sandboxes[r.ID]; ok {
		return // added before its creation, to settle it (Create)
	}
	c.sandboxes[r.ID] = &sandbox{
		id: r.ID, ns: ns, bundle: r.Bundle, upper: upper, opts: opts, cgroup: cgPath, stoppedCh: make(chan struct{}),
		bounds: b, forks: newForkLimiter(b), output: newOutputBudget(),
	}
}

// load prepares a sandbox for an operation on its branches (under sb.mu):
// the snapshotter connection and the root context, reconciled with the
// snapshotter's tree on first use and after every reconnection. A paused
// sandbox is refused (pause.go), and so is a caller that gave up while
// the operation waited for the sandbox.
func (c *Service) load(ctx context.Context, sb *sandbox) error {
	if err := c.view(ctx, sb); err != nil {
		return err
	}
	if c.Paused(sb) {
		return PausedError(sb)
	}
	return nil
}

// view is load for an operation that only reads, or that needs no
// process of a branch (the tree, waits, checkpoints): a paused sandbox is
// answered, but not reconciled until it is resumed.
func (c *Service) view(ctx context.Context, sb *sandbox) error {
	if sb.stopped {
		return fmt.Errorf("sandbox %s is stopped: its branches were ended with it; start a new task of it first: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox %s: the caller gave up before the operation could start: %w", sb.id, err)
	}
	if err := c.prepare(ctx, sb); err != nil {
		return err
	}
	c.sync(ctx, sb)
	return nil
}

// prepare dials the snapshotter and makes the root context, once.
func (c *Service) prepare(ctx context.Context, sb *sandbox) error {
	if sb.nodes != nil {
		return nil
	}
	if sb.upper == "" {
		return fmt.Errorf("sandbox %s: its rootfs is not an overlay with an upper directory; run it with --snapshotter branch: %w", sb.id, errdefs.ErrFailedPrecondition)
	}
	root, err := branch.RootOfUpper(sb.upper)
	if err != nil {
		return fmt.Errorf("sandbox %s: rootfs not from the branch snapshotter (run it with --snapshotter branch): %w", sb.id, err)
	}
	addr, err := os.ReadFile(filepath.Join(root, "address"))
	if err != nil {
		return fmt.Errorf("sandbox %s: find the branch snapshotter's socket in %s/address: %v: %w", sb.id, root, err, errdefs.ErrUnavailable)
	}
	kick := make(chan struct{}, 1)
	client, err := branchapi.DialNotify(strings.TrimSpace(string(addr)), func() { wake(kick) })
	if err != nil {
		return err
	}
	spec, err := ReadSpec(sb.bundle)
	if err != nil {
		client.Close()
		return err
	}
	cg, err := cgroup.SandboxPath(spec.Linux.CgroupsPath)
	if err != nil {
		client.Close()
		return fmt.Errorf("sandbox %s: %w", sb.id, err)
	}
	sb.snapshot = client
	sb.nodes = map[string]*bctx{branch.RootID: {
		id: branch.RootID, bundle: sb.bundle, cgroup: cg, spec: spec, net: NetShared,
	}}
	sb.kick, sb.done = kick, make(chan struct{})
	go c.settle(context.WithoutCancel(ctx), sb)
	if ms, err := c.hier(); err == nil {
		cgroup.HoldFreezerKey(ms, cg)
	}
	return nil
}

// initPid is the pid of a context's init on the host.
func (c *Service) initPid(ctx context.Context, sb *sandbox, n *bctx) (int, error) {
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
	if n.exited || pid <= 0 {
		return 0, fmt.Errorf("branch %s has no running init (its command exited): %w", n.id, errdefs.ErrFailedPrecondition)
	}
	return pid, nil
}

// start creates one branch context: its bundle, its rootfs mount and its
// init, through the same runtime path as any container of this shim.
// An init taken ahead for it (nil: none) is claimed or released. With a
// memory image (nil: none) the runtime restores its processes from it.
func (c *Service) start(ctx context.Context, sb *sandbox, parent *bctx, info branch.Info, join joinNS, req *shimv1.ForkRequest, warm *initdriver.Ahead, img *memoryImage) (_ *bctx, retErr error) {
	n := &bctx{
		id: info.ID, parent: parent.id, runtimeID: RuntimeID(sb.id, info.ID),
		bundle: filepath.Join(sb.bundle, branchesDir, info.ID),
		cgroup: branchCgroup(parent.cgroup, info.ID),
		net:    req.Net, seal: SealReadOnly, hasCommand: len(req.Args) > 0, limits: req.Limits,
		memory: img != nil,
	}
	spec, err := branchSpec(parent.spec, n.cgroup, join, req)
	if err != nil {
		return nil, err
	}
	n.spec = spec
	// Searchable, not listable, as containerd makes bundles: root of a
	// user namespace (a host uid of its range) must reach the rootfs.
	if err := os.MkdirAll(n.bundle, 0o711); err != nil {
		return nil, fmt.Errorf("branch %s: make bundle: %w", info.ID, err)
	}
	defer func() {
		if retErr != nil {
			c.closeSelf(sb.id, n.id)
			removeBundle(ctx, n.bundle)
		}
	}()
	if img != nil && req.Net == NetIsolated {
		// Its processes are restored into a namespace that exists.
		ns := filepath.Join(n.bundle, netnsFile)
		if err := makeIsolatedNetns(ns); err != nil {
			return nil, fmt.Errorf("branch %s: %w", info.ID, err)
		}
		for i := range spec.Linux.Namespaces {
			if spec.Linux.Namespaces[i].Type == specs.NetworkNamespace {
				spec.Linux.Namespaces[i].Path = ns
			}
		}
	}
	if err := c.listenSelfBranch(ctx, sb, n); err != nil {
		return nil, err
	}
	if img == nil && c.useInit(ctx, sb, spec) {
		var pool *initdriver.Pool
		if parent.id == branch.RootID {
			pool = sb.pool
		}
		if err := c.startWithInit(ctx, sb, n, info, pool, warm); err != nil {
			return nil, err
		}
		return n, nil
	}
	if err := writeSpec(n.bundle, spec); err != nil {
		return nil, fmt.Errorf("branch %s: write spec: %w", info.ID, err)
	}
	if err := c.runOnRuntime(ctx, sb, n, info.Mounts, img, req.Args); err != nil {
		return nil, err
	}
	return n, nil
}

// runOnRuntime runs context n's init with the runtime, in its bundle (spec
// written) on rootfs mounts: waiting, or running args, or restored from a
// memory image (nil: none).
func (c *Service) runOnRuntime(ctx context.Context, sb *sandbox, n *bctx, mounts []mount.Mount, img *memoryImage, args []string) error {
	opts := &options.Options{BinaryName: c.runtime, Root: DefaultRoot}
	if sb.opts != nil {
		if sb.opts.Root != "" {
			opts.Root = sb.opts.Root
		}
		// A branch is run as its sandbox is (runcopts.go).
		opts.NoPivotRoot, opts.NoNewKeyring = sb.opts.NoPivotRoot, sb.opts.NoNewKeyring
	}
	anyOpts, err := typeurl.MarshalAnyToProto(opts)
	if err != nil {
		return err
	}
	var rootfs []*types.Mount
	for _, m := range mounts {
		rootfs = append(rootfs, &types.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	cr := &taskAPI.CreateTaskRequest{ID: n.runtimeID, Bundle: n.bundle, Rootfs: rootfs, Options: anyOpts}
	if img != nil {
		// Created from the image: the runtime restores it at Start.
		cr.Checkpoint = img.dir
	}
	if n.hasCommand || n.memory {
		// The command's output is kept with the branch (init.log).
		cr.Stdout = "file://" + filepath.Join(n.bundle, "init.log")
		cr.Stderr = cr.Stdout
	}
	if img != nil {
		// Restored processes get a pipe as their stdin, as containerd
		// gives a sandbox's init: the runtime maps a dumped pipe to the
		// one it is given, and a later dump of this branch (a nested
		// memory fork, a checkpoint with memory) can carry a pipe, but
		// not the host's /dev/null the shim would give instead.
		stdin := filepath.Join(n.bundle, "stdin")
		if err := unix.Mkfifo(stdin, 0o600); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("branch %s: make its stdin: %w", n.id, err)
		}
		cr.Stdin = stdin
	}
	started := time.Now()
	// Not cut short when the caller gives up: a runtime killed midway
	// leaves its state for a container nobody knows of; the fork undoes
	// the whole branch instead.
	container, err := runc.NewContainer(context.WithoutCancel(ctx), c.platform, cr)
	if err != nil {
		return fmt.Errorf("branch %s: create its init: %w", n.id, errgrpc.ToNative(err))
	}
	n.container = container
	init, _ := container.Process("")
	if !n.memory {
		c.watch(init, started)
	}
	if n.hasCommand || n.memory {
		sctx := ctx
		if n.memory {
			// A restore is not cut short either: the runtime killed
			// midway would leave CRIU restoring on.
			sctx = context.WithoutCancel(ctx)
		}
		if _, err := container.Start(sctx, &taskAPI.StartRequest{ID: n.runtimeID}); err != nil {
			why := ""
			if n.memory {
				why = criuErrors(filepath.Join(n.bundle, "work", "restore.log")) // read before the bundle goes
			}
			c.destroy(ctx, sb, n)
			if n.memory {
				return fmt.Errorf("branch %s: restore its processes from the memory image: %w%s", n.id, errgrpc.ToNative(err), why)
			}
			return fmt.Errorf("branch %s: start %v: %w", n.id, args, errgrpc.ToNative(err))
		}
		if n.memory {
			// A restored init has its pid only now (a created one has
			// it from its create, above); an exit that came first is
			// pending since started.
			c.watch(init, started)
		}
		go func() {
			_ = init.Wait(context.WithoutCancel(ctx))
			sb.mu.Lock()
			// Not if the context runs another init meanwhile (a rollback
			// with memory restored one).
			if n.container == container {
				n.exited = true
			}
			sb.mu.Unlock()
		}()
	}
	return nil
}

// startWithInit starts a branch context with the branch init: its rootfs
// is mounted at <bundle>/rootfs as the runtime would, then the init builds
// the rest. The init is warm's if given, else taken from pool if it has
// one (nil: none), else started.
func (c *Service) startWithInit(ctx context.Context, sb *sandbox, n *bctx, info branch.Info, pool *initdriver.Pool, warm *initdriver.Ahead) (retErr error) {
	// The init is taken from the pool (its cgroup renamed to the
	// branch's), or started, while the rootfs is mounted.
	type spawnResult struct {
		s   *initdriver.Spawned
		err error
	}
	spawnDone := make(chan spawnResult, 1)
	go func() {
		flags := brinit.CloneFlags(n.spec)
		if warm != nil {
			if s := warm.Claim(ctx, n.cgroup); s != nil {
				if s.Flags == flags {
					spawnDone <- spawnResult{s: s}
					return
				}
				s.Discard(ctx)
			}
		} else if pool != nil {
			if s := pool.Take(ctx, flags, n.cgroup); s != nil {
				spawnDone <- spawnResult{s: s}
				return
			}
		}
		s, err := c.inits.Spawn(ctx, n.cgroup, flags)
		spawnDone <- spawnResult{s, err}
	}()
	rootfs := filepath.Join(n.bundle, "rootfs")
	var ms []mount.Mount
	for _, m := range info.Mounts {
		ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	err := os.Mkdir(rootfs, 0o711)
	if err != nil && !os.IsExist(err) {
		err = fmt.Errorf("branch %s: make rootfs mount point: %w", n.id, err)
	} else if err = mount.All(ms, rootfs); err != nil {
		err = fmt.Errorf("branch %s: mount rootfs: %w", n.id, err)
	}
	sr := <-spawnDone
	if err != nil || sr.err != nil {
		if sr.s != nil {
			sr.s.Discard(ctx)
		}
		if err == nil {
			_ = unix.Unmount(rootfs, unix.MNT_DETACH)
			err = fmt.Errorf("branch %s: %w", n.id, sr.err)
		}
		return err
	}
	fc, err := c.inits.Configure(ctx, n.initConfig(sb), sr.s, rootfs, filepath.Join(n.bundle, "init.log"))
	if err != nil {
		if uerr := mount.UnmountRecursive(rootfs, unix.MNT_DETACH); uerr != nil {
			log.G(ctx).WithError(uerr).WithField("branch", n.id).Warn("unmount rootfs of a failed branch")
		}
		return err
	}
	n.fast = fc
	if n.hasCommand {
		go func() {
			_ = fc.Init().Wait(context.WithoutCancel(ctx))
			sb.mu.Lock()
			n.exited = true
			sb.mu.Unlock()
		}()
	}
	return nil
}

// destroy kills every process of a context (and of any context nested in
// it), then removes its init, its rootfs mount, cgroup and bundle.
func (c *Service) destroy(ctx context.Context, sb *sandbox, n *bctx) {
	c.destroyAll(ctx, sb, []*bctx{n})()
}

// destroyAll destroys contexts together: their processes are all killed
// first, so that none of them runs on while another is taken down, then
// their rootfs mounts are detached. It returns once that is done, which is
// all the snapshotter needs before it commits or discards their layers,
// and all a caller needs before it replies: nothing of the branches runs
// any more. The rest (runtime state, cgroups, bundles) goes on in the
// background, counted in sb.releasing; the returned wait blocks until it
// is done.
func (c *Service) destroyAll(ctx context.Context, sb *sandbox, ns []*bctx) (wait func()) {
	ms, err := c.hier()
	if err != nil {
		log.G(ctx).WithError(err).Error("list cgroup hierarchies")
	}
	var live []*bctx
	for _, n := range ns {
		if n.procs() != nil {
			live = append(live, n)
		}
	}
	dirs := make([][]cgroup.Dir, len(live))
	// A branch frozen for its children may have frozen descendants among
	// ns, whose processes the kill of any of them reaches.
	frozen := false
	for _, n := range live {
		frozen = frozen || n.frozen || n.held
	}
	var wg sync.WaitGroup
	for i, n := range live {
		dirs[i] = cgroup.DirsIn(ms, n.cgroup)
		if n.fast != nil {
			// The branch runs on its own clone of the rootfs mount, so the
			// host's can go at once: its RCU grace period then overlaps
			// the one of the branch's mount namespace as it dies.
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := unix.Unmount(filepath.Join(n.bundle, "rootfs"), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
					log.G(ctx).WithError(err).WithField("branch", n.id).Warn("unmount branch rootfs")
				}
			}()
		}
		if n.held && len(dirs[i]) > 0 {
			// Signalled while still frozen, it dies as it thaws, without
			// running another instruction.
			err := cgroup.SignalAll(ctx, dirs[i])
			if err != nil {
				log.G(ctx).WithError(err).WithField("branch", n.id).Warn("kill held branch processes at once")
			}
			if err == nil && n.fast != nil && cgroup.HeldFrozen(dirs[i]) {
				// Frozen whole (a frozen cgroup's list of processes is
				// complete, and none can fork), so nothing of it runs
				// again: their exits are waited for by release, in the
				// background, rather than before the reply.
				cgroup.Thaw(dirs[i])
				continue
			}
		}
		pidfd := -1
		if n.fast != nil {
			pidfd = n.fast.Init().DupPidfd()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			kill := func() error { return cgroup.KillDirs(ctx, n.cgroup, dirs[i]) }
			if pidfd >= 0 {
				defer unix.Close(pidfd)
				kill = func() error { return cgroup.KillBranch(ctx, n.cgroup, dirs[i], pidfd, frozen) }
			}
			if err := kill(); err != nil {
				log.G(ctx).WithError(err).WithField("branch", n.id).Error("kill branch processes")
			}
		}()
	}
	wg.Wait()
	containers := make([]ctxProcs, len(live))
	for i, n := range live {
		switch {
		case n.fast != nil:
			sb.keepEnded(n.id, n.fast.Execd())
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
	}()
	return func() { <-done }
}

// detach takes a context whose processes are dead off its init and rootfs:
// it waits for the init's exit (from the shim's reaper) and unmounts the
// rootfs, after which the branch's layers are the snapshotter's alone.
func (c *Service) detach(ctx context.Context, n *bctx) ctxProcs {
	container := n.procs()
	n.container, n.fast = nil, nil
	if _, ok := container.(*initdriver.Branch); ok {
		// Its processes are gone from its cgroup, so they are dead: the
		// init's exit status (from the reaper) is not needed to go on.
		// Its host mount, which has nothing below it (the init mounted
		// the rest in the branch's own namespace, gone with it), was
		// detached with the kill.
		return container
	}
	if init, err := container.Process(""); err == nil {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := init.Wait(wctx); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("wait for branch init")
		}
		cancel()
	}
	if err := mount.UnmountRecursive(filepath.Join(n.bundle, "rootfs"), unix.MNT_DETACH); err != nil {
		log.G(ctx).WithError(err).WithField("branch", n.id).Warn("unmount branch rootfs")
	}
	return container
}

// release removes a detached context's runtime state and cgroups. The
// runtime state is destroyed in process (libcontainer needs no child
// process for a stopped container), which spares a run of the runtime
// binary per branch.
func (c *Service) release(ctx context.Context, sb *sandbox, n *bctx, procs ctxProcs, cgDirs []cgroup.Dir) {
	c.closeSelf(sb.id, n.id)
	if fc, ok := procs.(*initdriver.Branch); ok {
		fc.Close()
		// KillBranch looked at one hierarchy; a process put into the
		// cgroup from outside the branch may be in the others.
		if err := cgroup.KillLoop(ctx, n.cgroup, cgDirs, cgDirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Error("kill what is left in a branch cgroup")
		}
		if err := cgroup.RemoveDirs(cgDirs); err != nil {
			log.G(ctx).WithError(err).WithField("branch", n.id).Warn("remove branch cgroup")
		}
		go func() {
			ctx := context.WithoutCancel(ctx)
			for _, p := range fc.Execd() {
				_ = p.Delete(ctx) // its exit came with the init's
			}
			removeBundle(ctx, n.bundle)
		}()
		return
	}
	c.dropRuntimeState(ctx, sb, n, procs.(*runc.Container), cgDirs, func() {
		removeBundle(ctx, n.bundle)
	})
}

// dropRuntimeState removes the runtime's state and the cgroups of a
// detached context the runtime ran; what is left (stdio copiers, exec'd
// process records) holds nothing of the branch's and goes in the
// background, followed by then.
func (c *Service) dropRuntimeState(ctx context.Context, sb *sandbox, n *bctx, container *runc.Container, cgDirs []cgroup.Dir, then func()) {
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

// unsealIfIdle thaws a context frozen for its children when it has none.
func (c *Service) unsealIfIdle(ctx context.Context, sb *sandbox, n *bctx) {
	for _, o := range sb.nodes {
		if o.parent == n.id && o.id != branch.RootID {
			return
		}
	}
	if n.frozen {
		if err := cgroup.ThawOwn(ctx, n.cgroup); err != nil {
			log.G(ctx).WithError(err).WithField("context", n.id).Error("thaw sealed context")
		}
		n.frozen = false
	}
	n.seal = SealReadOnly
}

// Teardown removes every branch context of a sandbox whose task is being
// deleted, and unseals its rootfs, so that nothing outlives it.
func (c *Service) Teardown(ctx context.Context, id string) {
	defer c.CloseSelfAll(id)
	c.mu.Lock()
	sb, ok := c.sandboxes[id]
	delete(c.sandboxes, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	c.endAll(ctx, sb)
	if sb.snapshot != nil {
		sb.snapshot.Close()
	}
}

// SandboxExited kills and discards every branch of a sandbox whose init
// exited, as runc-v2 kills every process of a container whose init
// exited: the branches live in their own PID namespaces, which the init's
// end does not reach. Branch operations on it fail from then on, until
// its task is deleted and a new one created.
func (c *Service) SandboxExited(ctx context.Context, id string) {
	sb, err := c.Sandbox(id)
	if err != nil {
		return
	}
	defer sb.markStopped()
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.stopped = true
	c.endAll(ctx, sb)
}

// markStopped says that nothing of the sandbox's branches runs any more.
func (sb *sandbox) markStopped() {
	sb.stopOnce.Do(func() { close(sb.stoppedCh) })
}

// WaitStopped waits until the branches of a sandbox whose init exited are
// gone, so that a Wait for its init returns only once nothing of it runs.
func (c *Service) WaitStopped(ctx context.Context, id string) error {
	sb, err := c.Sandbox(id)
	if err != nil {
		return nil // deleted: Teardown took its branches
	}
	select {
	case <-sb.stoppedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endAll kills and discards every branch of a sandbox, with the guarantees
// of an abort, and unseals its rootfs; sb.mu is held. It runs once.
func (c *Service) endAll(ctx context.Context, sb *sandbox) {
	if sb.nodes == nil || sb.closed {
		return
	}
	sb.closed = true
	close(sb.done)
	if sb.pool != nil {
		sb.pool.Close(ctx)
		sb.pool = nil
	}
	defer sb.initPath.Close()
	for _, d := range sb.descendants(branch.RootID) {
		c.destroy(ctx, sb, d)
		delete(sb.nodes, d.id)
		if d.parent == branch.RootID {
			if _, err := sb.snapshot.Abort(ctx, sb.ref(d.id)); err != nil {
				log.G(ctx).WithError(err).WithField("branch", d.id).Warn("abort branch of ended sandbox")
			}
		}
	}
	if root := sb.nodes[branch.RootID]; root != nil && root.frozen {
		_ = cgroup.ThawOwn(ctx, root.cgroup)
		root.frozen = false
	}
	// The sandbox's cgroup goes after this: its branches' must be gone.
	sb.releasing.Wait()
	if ms, err := c.hier(); err == nil && sb.nodes[branch.RootID] != nil {
		cgroup.ReleaseFreezerKey(ms, sb.nodes[branch.RootID].cgroup)
	}
}

// stopBranches is the cleanup of a sandbox whose shim died: it force
// deletes every branch context's runtime container (killing its processes
// through its cgroup) and detaches its rootfs mount. It needs nothing from
// the dead shim: the branches are found in the bundle.
func stopBranches(ctx context.Context, r *runcC.Runc, bundle, id string) {
	killBranchCgroups(ctx, bundle)
	// A branch the runtime was still creating or restoring when the shim
	// died has cgroups but no state the runtime's delete finds: the
	// branch cgroups, emptied above, are removed last.
	defer removeBranchCgroups(ctx, bundle)
	entries, _ := os.ReadDir(filepath.Join(bundle, branchesDir))
	for _, e := range entries {
		// Only a branch run by the runtime has its spec in its bundle;
		// one run by the branch init ends with the shim's control socket.
		if _, err := os.Stat(filepath.Join(bundle, branchesDir, e.Name(), "config.json")); err != nil {
			// fall through to the unmount
		} else if err := r.Delete(ctx, RuntimeID(id, e.Name()), &runcC.DeleteOpts{Force: true}); err != nil {
			log.G(ctx).WithError(err).WithField("branch", e.Name()).Warn("delete branch container")
		}
		if err := mount.UnmountRecursive(filepath.Join(bundle, branchesDir, e.Name(), "rootfs"), unix.MNT_DETACH); err != nil {
			log.G(ctx).WithError(err).WithField("branch", e.Name()).Warn("unmount branch rootfs")
		}
		detachNetns(ctx, filepath.Join(bundle, branchesDir, e.Name()))
	}
}

// killBranchCgroups kills every process in the cgroups below a sandbox's
// (branches, warm inits, the seal leaf), thawing them first. The runtime's
// force delete of the sandbox freezes, kills and thaws the sandbox's
// cgroup, but on cgroup v1 a child frozen by itself (a branch held for a
// commit when the shim died) stays frozen, and its processes with it,
// ignoring SIGKILL. A paused sandbox is killed whole and thawed first.
func killBranchCgroups(ctx context.Context, bundle string) {
	spec, err := ReadSpec(bundle)
	if err != nil || spec.Linux == nil {
		return
	}
	cg, err := cgroup.SandboxPath(spec.Linux.CgroupsPath)
	if err != nil {
		return
	}
	killCgroupsBelow(ctx, cg)
}

// removeBranchCgroups removes the cgroups below a sandbox's (its branches',
// their seal and own leaves), deepest first; their processes are gone.
func removeBranchCgroups(ctx context.Context, bundle string) {
	spec, err := ReadSpec(bundle)
	if err != nil || spec.Linux == nil {
		return
	}
	cg, err := cgroup.SandboxPath(spec.Linux.CgroupsPath)
	if err != nil {
		return
	}
	ms, err := cgroup.Mounts()
	if err != nil {
		return
	}
	// A killed task whose parent died too is reaped by the host's init,
	// maybe late, and on cgroup v1 keeps its cgroup busy until then:
	// tried for a while, within containerd's cleanup timeout.
	var err2 error
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		var errs []error
		for _, d := range cgroup.DirsIn(ms, cg) {
			entries, _ := os.ReadDir(d.Path)
			for _, e := range entries {
				// The sandbox's own leaves go with the sandbox's cgroup.
				if e.IsDir() && e.Name() != cgroup.OwnLeaf && e.Name() != cgroup.SealLeaf {
					errs = append(errs, cgroup.RemoveDirs(cgroup.DirsIn(ms, cg+"/"+e.Name())))
				}
			}
		}
		if err2 = errors.Join(errs...); err2 == nil || time.Now().After(deadline) {
			break
		}
	}
	if err2 != nil {
		log.G(ctx).WithError(err2).Warn("remove branch cgroups")
	}
}

// killCgroupsBelow is killBranchCgroups for the sandbox cgroup sbPath (a
// cgroupfs path: SandboxPath's).
func killCgroupsBelow(ctx context.Context, sbPath string) {
	ms, err := cgroup.Mounts()
	if err != nil {
		log.G(ctx).WithError(err).Warn("list cgroup hierarchies")
		return
	}
	sbDirs := cgroup.DirsIn(ms, sbPath)
	if len(sbDirs) > 0 && cgroup.Frozen(sbDirs) {
		// Paused: thawing a branch below the frozen sandbox does nothing.
		// Everything is killed while frozen (a frozen task takes a
		// pending SIGKILL as it thaws, before it runs again), then
		// thawed; the force delete that follows kills the sandbox anyway.
		if err := cgroup.SignalAll(ctx, sbDirs); err != nil {
			log.G(ctx).WithError(err).Warn("kill the processes of a paused sandbox at once")
		}
		cgroup.Thaw(sbDirs)
	}
	seen := map[string]bool{}
	for _, d := range sbDirs {
		entries, _ := os.ReadDir(d.Path)
		for _, e := range entries {
			if !e.IsDir() || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			path := sbPath + "/" + e.Name()
			if err := cgroup.KillDirs(ctx, path, cgroup.DirsIn(ms, path)); err != nil {
				log.G(ctx).WithError(err).WithField("cgroup", path).Warn("kill branch processes")
			}
		}
	}
}
