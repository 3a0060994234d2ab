//go:build linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/branchbox/branchbox/shim/cmdlog"
	"github.com/branchbox/branchbox/shim/initdriver"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
)

// The life of a sandbox's branches: a sandbox added and prepared, a branch
// started (by a branch init or the runtime), destroyed and released, and
// every branch ended with its sandbox.

// A branch's output (its command's, or its restored processes'), kept in
// its bundle: the log and the FIFO the task service writes it to.
const (
	initLog    = "init.log"
	outputFIFO = "output"
)

// start creates one branch: its bundle, its rootfs mount and its
// init, through the same runtime path as any container of this shim.
// An init taken ahead for it (nil: none) is claimed or released. With a
// memory image (nil: none) the runtime restores its processes from it.
func (c *Service) start(ctx context.Context, sb *Sandbox, parent *Branch, info branch.Info, join joinNS, req *shimv1.ForkRequest, warm *initdriver.Ahead, img *memoryImage) (_ *Branch, retErr error) {
	n := &Branch{
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
	if img != nil {
		restoredUserNS(spec)
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
		if err := makeIsolatedNetns(ns, spec.Linux.Sysctl); err != nil {
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
	if err := writeSpec(n.bundle, runtimeSpec(spec, req.Limits)); err != nil {
		return nil, fmt.Errorf("branch %s: write spec: %w", info.ID, err)
	}
	if err := c.runOnRuntime(ctx, sb, n, info.Mounts, img, req.Args); err != nil {
		return nil, err
	}
	return n, nil
}

// createRequest is the task service's request that creates branch n's
// init with the runtime, run as its sandbox is; the copy of its output,
// if kept, is started, and keep is to be called once the task service
// has opened it (or failed).
func (c *Service) createRequest(ctx context.Context, sb *Sandbox, n *Branch, mounts []mount.Mount, img *memoryImage) (_ *taskAPI.CreateTaskRequest, keep func(), err error) {
	keep = func() {}
	opts := &options.Options{BinaryName: c.runtime, Root: DefaultRoot}
	if sb.opts != nil {
		if sb.opts.Root != "" {
			opts.Root = sb.opts.Root
		}
		// A branch is run as its sandbox is (shim/runcopts.go).
		opts.NoPivotRoot, opts.NoNewKeyring = sb.opts.NoPivotRoot, sb.opts.NoNewKeyring
	}
	anyOpts, err := typeurl.MarshalAnyToProto(opts)
	if err != nil {
		return nil, nil, err
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
	if img != nil {
		// Restored processes get a pipe as their stdin, as containerd
		// gives a sandbox's init: the runtime maps a dumped pipe to the
		// one it is given, and a later dump of this branch (a nested
		// memory fork, a checkpoint with memory) can carry a pipe, but
		// not the host's /dev/null the shim would give instead.
		stdin := filepath.Join(n.bundle, "stdin")
		if err := unix.Mkfifo(stdin, 0o600); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, nil, fmt.Errorf("branch %s: make its stdin: %w", n.id, err)
		}
		cr.Stdin = stdin
	}
	if n.hasCommand || n.memory {
		// The command's output is kept with the branch, bounded: the
		// task service writes it to a FIFO the shim copies into
		// init.log (shim/cmdlog).
		cr.Stdout = filepath.Join(n.bundle, outputFIFO)
		cr.Stderr = cr.Stdout
		// Last: from here the log runs until keep.
		if keep, err = n.startOutput(ctx, cr.Stdout); err != nil {
			return nil, nil, err
		}
	}
	return cr, keep, nil
}

// runOnRuntime runs branch n's init with the runtime, in its bundle (spec
// written) on rootfs mounts: waiting, or running args, or restored from a
// memory image (nil: none).
func (c *Service) runOnRuntime(ctx context.Context, sb *Sandbox, n *Branch, mounts []mount.Mount, img *memoryImage, args []string) error {
	cr, keep, err := c.createRequest(ctx, sb, n, mounts, img)
	if err != nil {
		return err
	}
	defer keep() // the task service has opened the output by then, or failed
	if img != nil {
		c.clearRestoredCaller(ctx, sb, n, img.dir)
		if err := imageForUserNS(img.dir, n.spec); err != nil {
			return fmt.Errorf("branch %s: %w", n.id, err)
		}
	}
	if n.parent == branch.RootID && sb.pool != nil {
		// The pool may have started an init in the cgroup of this name.
		sb.pool.Evict(ctx, n.cgroup)
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
		start := func() error {
			_, err := container.Start(sctx, &taskAPI.StartRequest{ID: n.runtimeID})
			return err
		}
		restoreLog := filepath.Join(n.bundle, restoreWorkDir, "restore.log")
		var err error
		if n.memory && img != nil {
			err = watchRestore(ctx, n.bundle, restoreLog, img.size, start)
		} else {
			err = start()
		}
		if err != nil {
			why := ""
			if n.memory {
				why = criuErrors(err, restoreLog) // read before the bundle goes
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
			if img != nil {
				c.tellRestoredCaller(ctx, sb, n, img.dir)
			}
		}
		go func() {
			_ = init.Wait(context.WithoutCancel(ctx))
			sb.mu.Lock()
			// Not if the branch runs another init meanwhile (a rollback
			// with memory restored one).
			if n.container == container {
				n.state.set(exited)
			}
			sb.mu.Unlock()
		}()
	}
	return nil
}

// startOutput starts the copy of what branch n's processes, run by the
// runtime, write to fifo into its log; keep is to be called once the
// task service has opened fifo (or failed).
func (n *Branch) startOutput(ctx context.Context, fifo string) (keep func(), err error) {
	if n.output != nil {
		// The processes a restore replaces were killed: what they wrote
		// last goes to the log first (a bounded wait).
		select {
		case <-n.output.Done():
		case <-time.After(time.Second):
		}
	}
	out, keep, err := cmdlog.FIFO(ctx, fifo, filepath.Join(n.bundle, initLog), cmdlog.MaxSize)
	if err != nil {
		return nil, fmt.Errorf("branch %s: its output log: %w", n.id, err)
	}
	n.output = out
	return keep, nil
}

// startWithInit starts a branch with the branch init: its rootfs
// is mounted at <bundle>/rootfs as the runtime would, then the init builds
// the rest. The init is warm's if given, else taken from pool if it has
// one (nil: none), else started.
func (c *Service) startWithInit(ctx context.Context, sb *Sandbox, n *Branch, info branch.Info, pool *initdriver.Pool, warm *initdriver.Ahead) (retErr error) {
	// The init is taken from the pool (its cgroup renamed to the
	// branch's), or started, while the rootfs is mounted.
	rootfs := filepath.Join(n.bundle, "rootfs")
	fc, err := c.inits.StartBranch(ctx, n.initConfig(sb), initdriver.From{Ahead: warm, Pool: pool}, rootfs, filepath.Join(n.bundle, initLog), func() error {
		var ms []mount.Mount
		for _, m := range info.Mounts {
			ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
		}
		err := os.Mkdir(rootfs, 0o711)
		if err != nil && !os.IsExist(err) {
			return fmt.Errorf("branch %s: make rootfs mount point: %w", n.id, err)
		}
		if err = mount.All(ms, rootfs); err != nil {
			return fmt.Errorf("branch %s: mount rootfs: %w", n.id, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	n.init = fc
	// Held from now on: the snapshotter may detach the host's mount
	// before the shim destroys the branch (a commit's losers).
	n.rootfs = holdRootfs(rootfs)
	n.mntns = holdMntns(fc.Init())
	if n.hasCommand {
		go func() {
			_ = fc.Init().Wait(context.WithoutCancel(ctx))
			sb.mu.Lock()
			n.state.set(exited)
			sb.mu.Unlock()
		}()
	}
	return nil
}

// useInit says whether the branch of spec is started by the branch init,
// and logs, once per sandbox (and again if the answer changes), which way
// its branches go and why.
func (c *Service) useInit(ctx context.Context, sb *Sandbox, spec *specs.Spec) bool {
	reason := ""
	if c.inits.Binary == "" {
		reason = "the branch init (" + initdriver.InitBinary + ") is not installed beside the shim"
	} else if sb.opts != nil && sb.opts.NoPivotRoot {
		reason = "runtime option NoPivotRoot: the branch init always pivots"
	} else if reason = initdriver.Unsupported(spec); reason == "" && spec.Linux.Seccomp != nil {
		if _, err := sb.initPath.Seccomp(ctx, spec.Linux.Seccomp); err != nil {
			reason = "seccomp profile not compiled for the branch init: " + err.Error()
		}
	}
	sb.initPath.Log(ctx, sb.id, reason, spec.Linux.Seccomp != nil)
	return reason == ""
}
