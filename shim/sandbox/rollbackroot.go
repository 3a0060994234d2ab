//go:build linux

package sandbox

// A rollback of the sandbox itself to a checkpoint with memory: its
// processes are ended, its rootfs rolled back, and the checkpoint's
// processes restored as the same task (same id, bundle, cgroup, network
// namespace and standard streams; new host pids). The task service deletes
// the old init's task and creates the new one from the image; containerd
// sees one task that runs on (replace.go holds back the events between).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/ocirt"
)

// rollbackRoot brings the sandbox (its root branch n) back to checkpoint
// ck with its processes. If the restore fails, the sandbox has stopped:
// its old processes' exit (SIGKILL) is published then, and the error says
// why.
func (c *Service) rollbackRoot(ctx context.Context, sb *Sandbox, n *Branch, ck branch.Checkpoint) error {
	what := fmt.Sprintf("rollback of %s to %q", sb.id, ck.Name)
	img, pid, err := c.checkRollbackRoot(ctx, sb, n, ck, what)
	if err != nil {
		return err
	}
	// From here on it is carried through whatever the caller does: a
	// sandbox left between its old processes and its new ones is no use.
	ctx = context.WithoutCancel(ctx)
	unkeep, err := keepNetNS(sb.bundle, pid)
	if err != nil {
		return fmt.Errorf("%s: keep its network namespace: %w", what, err)
	}
	defer unkeep(ctx)
	if sb.pool != nil {
		// Its inits were started in the old processes' namespaces.
		sb.pool.Close(ctx)
		sb.pool = nil
	}
	end := c.beginReplace(sb)
	defer end()
	ms, err := c.cgroups.Mounts()
	if err == nil {
		err = cgroup.KillDirs(ctx, n.cgroup, cgroup.DirsIn(ms, n.cgroup))
	}
	if err != nil {
		c.replaceFailed(ctx, sb, nil, false)
		return fmt.Errorf("%s: kill its processes: %w", what, err)
	}
	// The task service has seen its init end once its Wait returns.
	if _, err := c.task.Wait(ctx, &taskAPI.WaitRequest{ID: sb.id}); err != nil {
		c.replaceFailed(ctx, sb, c.heldExit(sb), false)
		return fmt.Errorf("%s: its processes were killed: wait for its init: %w", what, errgrpc.ToNative(err))
	}
	exit := c.heldExit(sb)
	c.expect(sb, runtime.TaskDeleteEventTopic)
	if _, err := c.task.Delete(ctx, &taskAPI.DeleteRequest{ID: sb.id}); err != nil {
		c.unexpect(sb, runtime.TaskDeleteEventTopic)
		c.replaceFailed(ctx, sb, exit, false)
		return fmt.Errorf("%s: its processes were killed: delete its old task: %w", what, errgrpc.ToNative(err))
	}
	if err := c.restoreRoot(ctx, sb, n, ck, img); err != nil {
		c.replaceFailed(ctx, sb, exit, true)
		return fmt.Errorf("%s: its processes were killed and %w; the sandbox has stopped", what, err)
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "checkpoint": ck.Name}).Info("sandbox rolled back with its processes")
	return nil
}

// checkRollbackRoot refuses, before anything changes, a rollback of the
// sandbox with its processes that could not be done; it returns the image
// to restore and the pid of the sandbox's init.
func (c *Service) checkRollbackRoot(ctx context.Context, sb *Sandbox, n *Branch, ck branch.Checkpoint, what string) (*memoryImage, int, error) {
	if err := c.checkRollbackMemory(sb, n, ck, what); err != nil {
		return nil, 0, err
	}
	if sb.create == nil || sb.create.Terminal {
		// A checkpoint with memory of it was refused already.
		return nil, 0, fmt.Errorf("%s: its init holds a terminal whose other end is on the host, which restored processes cannot be given: %w", what, errdefs.ErrFailedPrecondition)
	}
	img, err := keptImage(what, ck)
	if err != nil {
		return nil, 0, err
	}
	if _, err := criuPath(c.self); err != nil {
		return nil, 0, c.noCriu(what)
	}
	pid, err := c.initPid(ctx, sb, n)
	if err != nil {
		return nil, 0, err
	}
	return img, pid, nil
}

// restoreRoot rolls the sandbox's rootfs back to ck and has the task
// service create its task again from the checkpoint's memory image, once
// the old task was deleted.
func (c *Service) restoreRoot(ctx context.Context, sb *Sandbox, n *Branch, ck branch.Checkpoint, img *memoryImage) error {
	// The old processes are gone: a snapshotter restarting meanwhile is
	// waited for, rather than the sandbox given up (a rollback to the
	// same checkpoint again is the same rollback).
	err := retryUnavailable(ctx, func() error {
		return sb.snapshot.Rollback(ctx, sb.ref(n.id), ck.Name, branch.WithProcesses())
	})
	if err != nil {
		return fmt.Errorf("its rootfs could not be rolled back: %w", err)
	}
	var mounts []mount.Mount
	err = retryUnavailable(ctx, func() (err error) {
		mounts, err = sb.snapshot.Mounts(ctx, sb.ref(n.id))
		return err
	})
	if err != nil {
		return fmt.Errorf("its rootfs, the checkpoint's, could not be mounted: %w", err)
	}
	opts, err := restoreOptions(sb)
	if err != nil {
		return err
	}
	cr := &taskAPI.CreateTaskRequest{
		ID: sb.create.ID, Bundle: sb.create.Bundle, Terminal: sb.create.Terminal, Options: opts,
		Stdin: sb.create.Stdin, Stdout: sb.create.Stdout, Stderr: sb.create.Stderr,
		Checkpoint: img.dir,
	}
	for _, m := range mounts {
		cr.Rootfs = append(cr.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	c.clearRestoredCaller(ctx, sb, n, img.dir)
	if spec, err := ReadSpec(sb.bundle); err == nil {
		if err := imageForUserNS(img.dir, spec); err != nil {
			return err
		}
	}
	c.expect(sb, runtime.TaskCreateEventTopic)
	if _, err = c.task.Create(ctx, cr); err != nil {
		c.unexpect(sb, runtime.TaskCreateEventTopic)
		return fmt.Errorf("its task could not be created again: %w", errgrpc.ToNative(err))
	}
	c.expect(sb, runtime.TaskStartEventTopic)
	readers := holdReaders(ctx, cr.Stdout, cr.Stderr)
	restoreLog := filepath.Join(sb.bundle, sandboxRestoreWorkDir, "restore.log")
	err = watchRestore(ctx, sb.bundle, restoreLog, img.size, func() error {
		_, err := c.task.Start(ctx, &taskAPI.StartRequest{ID: sb.id})
		return err
	})
	readers()
	if err != nil {
		c.unexpect(sb, runtime.TaskStartEventTopic)
		why := criuErrors(err, restoreLog)
		c.expect(sb, runtime.TaskDeleteEventTopic)
		if _, derr := c.task.Delete(ctx, &taskAPI.DeleteRequest{ID: sb.id}); derr != nil {
			c.unexpect(sb, runtime.TaskDeleteEventTopic)
			log.G(ctx).WithError(derr).WithField("sandbox", sb.id).Warn("delete the task of a failed restore")
		}
		return fmt.Errorf("the checkpoint's processes could not be restored: %w%s", errgrpc.ToNative(err), why)
	}
	c.tellRestoredCaller(ctx, sb, n, img.dir)
	return nil
}

// keepNetNS bind mounts the network namespace of process pid into the
// bundle (ocirt.KeptNetNSFile), where the runtime's delete and restore
// find it; undo removes it.
func keepNetNS(bundle string, pid int) (undo func(context.Context), err error) {
	p := filepath.Join(bundle, ocirt.KeptNetNSFile)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		// Left by a shim killed midway: its namespace is not this one.
		_ = unix.Unmount(p, unix.MNT_DETACH)
		f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	}
	if err != nil {
		return nil, err
	}
	f.Close()
	if err := unix.Mount(fmt.Sprintf("/proc/%d/ns/net", pid), p, "", unix.MS_BIND, ""); err != nil {
		os.Remove(p)
		return nil, err
	}
	return func(ctx context.Context) { dropKeptNetNS(ctx, bundle) }, nil
}

// dropKeptNetNS detaches and removes the network namespace a bundle keeps
// for a replacement, if it keeps one.
func dropKeptNetNS(ctx context.Context, bundle string) {
	p := filepath.Join(bundle, ocirt.KeptNetNSFile)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		log.G(ctx).WithError(err).WithField("bundle", bundle).Warn("detach the kept network namespace")
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).WithField("bundle", bundle).Warn("remove the kept network namespace")
	}
}

// holdReaders opens the named pipes among a task's output paths for
// reading, until the returned func is called. The task service opens them
// for writing, which waits for a reader, and then keeps a reader of its
// own: a sandbox whose client went away (ctr run -d) has none, and its
// restore would wait forever. Nothing is read: output goes to whoever
// reads, as before.
func holdReaders(ctx context.Context, paths ...string) (closeAll func()) {
	var fds []int
	for _, p := range paths {
		if p == "" || strings.Contains(p, "://") {
			continue // none, or a file or logging binary the shim opens
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			continue
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			log.G(ctx).WithError(err).WithField("path", p).Warn("open a task's output for its restore")
			continue
		}
		fds = append(fds, fd)
	}
	return func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// snapshotterRestart bounds the wait for a snapshotter that went away in
// the middle of a replacement of a sandbox's processes.
const snapshotterRestart = 20 * time.Second

// retryUnavailable calls f until it does not fail for want of the
// snapshotter, for at most snapshotterRestart.
func retryUnavailable(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(snapshotterRestart)
	for {
		err := f()
		if !errdefs.IsUnavailable(err) || time.Now().After(deadline) {
			return err
		}
		log.G(ctx).WithError(err).Warn("replacing a sandbox's processes: waiting for the snapshotter")
		time.Sleep(100 * time.Millisecond)
	}
}

// sandboxRestoreWorkDir, in a sandbox's bundle, is CRIU's work directory
// for the restore of its processes (its log, and the runtime's tmpfs
// copies). Not the task service's default, <bundle>/work: containerd
// links that into its root directory, which the root of a user namespace
// CRIU restores in cannot reach, where it can reach the bundle.
const sandboxRestoreWorkDir = "restore-work"

// restoreOptions are the sandbox's runtime options (as its create
// recorded them, parsed) with CRIU's work directory at
// sandboxRestoreWorkDir.
func restoreOptions(sb *Sandbox) (*anypb.Any, error) {
	if sb.opts == nil {
		return nil, fmt.Errorf("its runtime options were not recorded: %w", errdefs.ErrFailedPrecondition)
	}
	o := proto.Clone(sb.opts).(*options.Options)
	o.CriuWorkPath = filepath.Join(sb.bundle, sandboxRestoreWorkDir)
	return typeurl.MarshalAnyToProto(o)
}
