//go:build linux

// Package shim is the runtime io.containerd.branch.v1: containerd's own
// runc-v2 task service and shim manager, driving this same binary as their
// runc-compatible runtime (package ocirt, on runc's libcontainer), so no
// runc binary is needed and containerd sees exactly runc-v2's behaviour.
package shim

import (
	"github.com/branchbox/branchbox/branch"

	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/containerd/v2/version"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	runcC "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/ocirt"
	"github.com/branchbox/branchbox/shim/sandbox"
)

// NewManager returns the shim manager: runc-v2's, for starting shims,
// with the cleanup path (Stop) and Info pointed at this runtime.
func NewManager() cshim.Manager {
	return &shimManager{Manager: manager.NewShimManager(branch.RuntimeName)}
}

type shimManager struct {
	cshim.Manager
}

// Stop is containerd's cleanup path (`containerd-shim-branch-v1 delete`,
// run in the bundle directory) after a shim exited or was killed: it force
// deletes the container, which kills every process in its cgroup, thawing
// it first, and removes cgroup and state, then unmounts the rootfs. It
// works without the shim: nothing here depends on the dead process.
func (m *shimManager) Stop(ctx context.Context, id string) (cshim.StopStatus, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return cshim.StopStatus{}, err
	}
	path := filepath.Join(filepath.Dir(cwd), id)
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return cshim.StopStatus{}, err
	}
	opts, err := sandbox.DeadShimOptions(ctx, path)
	if err != nil {
		return cshim.StopStatus{}, fmt.Errorf("read runtime options of %s: %w", id, err)
	}
	root := sandbox.DefaultRoot
	if opts != nil && opts.Root != "" {
		root = opts.Root
	}
	self, err := os.Executable()
	if err != nil {
		return cshim.StopStatus{}, fmt.Errorf("find own executable: %w", err)
	}
	r := process.NewRunc(root, path, ns, self, false)
	sandbox.StopDead(ctx, r, filepath.Join(root, ns), path, id)
	if err := r.Delete(ctx, id, &runcC.DeleteOpts{Force: true}); err != nil {
		log.G(ctx).WithError(err).Warn("failed to remove container")
	}
	sandbox.RemoveDeadSandboxCgroup(ctx, path)
	unmountDeadRootfs(ctx, filepath.Join(path, "rootfs"))
	pid, err := runcC.ReadPidFile(filepath.Join(path, process.InitPidFile))
	if err != nil {
		log.G(ctx).WithError(err).Warn("failed to read init pid file")
	}
	removeDeadSockets(ctx, path, id)
	return cshim.StopStatus{
		ExitedAt:   time.Now(),
		ExitStatus: 128 + int(unix.SIGKILL),
		Pid:        pid,
	}, nil
}

// unmountDeadRootfs unmounts a dead shim's sandbox rootfs. Its processes,
// just killed, may still be ending and hold it busy for a moment (a sealed
// sandbox's, thawed to take the kill, or one a memory fork's CRIU held):
// it is tried for a while, then detached, so that no mount is left.
func unmountDeadRootfs(ctx context.Context, rootfs string) {
	var err error
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err = mount.UnmountRecursive(rootfs, 0); err == nil || !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			break
		}
	}
	if errors.Is(err, unix.EBUSY) {
		err = mount.UnmountRecursive(rootfs, unix.MNT_DETACH)
	}
	if err != nil {
		log.G(ctx).WithError(err).Warn("failed to clean up rootfs mount")
	}
}

// removeDeadSockets removes the sockets of a shim that was killed (it could
// not remove them itself): the one containerd recorded in the bundle, and
// its debug socket. A socket something still answers on is a live shim's
// (one shim may serve several containers) and is left.
func removeDeadSockets(ctx context.Context, bundle, id string) {
	address, err := sandbox.ShimAddress(bundle)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).Warn("read shim address")
		}
		return
	}
	sockets := []string{address}
	// The debug socket is named from containerd's address and the socket's
	// grouping (the container, or the sandbox it is grouped with), as the
	// manager named the main one: found by matching that.
	if f := flag.Lookup("address"); f != nil && f.Value.String() != "" {
		for _, group := range shimGroups(bundle, id) {
			if main, err := cshim.SocketAddress(ctx, f.Value.String(), group, false); err == nil && main == address {
				if debug, err := cshim.SocketAddress(ctx, f.Value.String(), group, true); err == nil {
					sockets = append(sockets, debug)
				}
				break
			}
		}
	}
	for _, s := range sockets {
		path, ok := strings.CutPrefix(s, "unix://")
		if !ok {
			continue // abstract or another scheme: no file
		}
		conn, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			conn.Close()
			continue // served: a live shim's
		}
		if !errors.Is(err, unix.ECONNREFUSED) {
			continue // gone already, or not ours to judge
		}
		if err := cshim.RemoveSocket(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).WithField("socket", path).Warn("remove socket of a dead shim")
		}
	}
}

// shimGroups lists what a container's shim socket may be named after: the
// groups of its spec's annotations (as the manager looks them up) and the
// container itself.
func shimGroups(bundle, id string) []string {
	var out []string
	if spec, err := sandbox.ReadSpec(bundle); err == nil {
		for _, k := range []string{"io.kubernetes.cri.sandbox-id", "io.containerd.runc.v2.group"} {
			if g := spec.Annotations[k]; g != "" {
				out = append(out, g)
			}
		}
	}
	return append(out, id)
}

// Info reports this runtime's features from the code itself rather than by
// running a runtime binary.
func (m *shimManager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	info := &types.RuntimeInfo{
		Name:    branch.RuntimeName,
		Version: &types.RuntimeVersion{Version: version.Version, Revision: version.Revision},
	}
	var err error
	if info.Features, err = typeurl.MarshalAnyToProto(ocirt.Features()); err != nil {
		return nil, fmt.Errorf("marshal features: %w", err)
	}
	return info, nil
}

// Register registers the task service as the shim's ttrpc "task" plugin;
// call it once, before running the shim.
func Register() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (interface{}, error) {
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			self, err := os.Executable()
			if err != nil {
				return nil, fmt.Errorf("find own executable: %w", err)
			}
			pub := &exitPublisher{Publisher: pp.(cshim.Publisher)}
			inner, err := task.NewTaskService(ic.Context, pub, ss.(shutdown.Service))
			if err != nil {
				return nil, err
			}
			cs, err := sandbox.NewService(ic.Context, self, pp.(cshim.Publisher), inner)
			if err != nil {
				return nil, err
			}
			pub.sandboxes.Store(cs)
			return &taskService{TTRPCTaskService: inner, self: self, sandboxes: cs}, nil
		},
	})
}

// exitPublisher is the task service's publisher: when a container's init
// exits it ends the container's branches before the exit is published, so
// that containerd, and whoever waits for the exit, sees a stopped sandbox
// only once nothing of it runs. While a rollback with memory replaces a
// sandbox's processes, the events of the old init's end and of the new
// one's creation are not published (sandbox.Service.HoldEvent).
type exitPublisher struct {
	cshim.Publisher
	sandboxes atomic.Pointer[sandbox.Service]
}

func (p *exitPublisher) Publish(ctx context.Context, topic string, event events.Event) error {
	c := p.sandboxes.Load()
	if c != nil && c.HoldEvent(ctx, topic, event) {
		return nil // a replacement of the sandbox's processes runs
	}
	if e, ok := event.(*eventstypes.TaskExit); ok && e.ID == e.ContainerID && c != nil {
		c.SandboxExited(ctx, e.ContainerID)
	}
	return p.Publisher.Publish(ctx, topic, event)
}

// taskService is runc-v2's task service with the runtime options of every
// new container set to run this binary as the runtime, serving the branch
// API (shimv1.Branches) on the same ttrpc server.
type taskService struct {
	taskAPI.TTRPCTaskService
	self      string
	sandboxes *sandbox.Service
}

func (s *taskService) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	shimv1.RegisterBranchesService(server, s.sandboxes)
	// Its old name, for the clients built before the rename (deprecated,
	// removed in the release after next: docs/design.md#names).
	shimv1.RegisterContextsService(server, s.sandboxes)
	return nil
}

// Delete removes a sandbox's branches before the sandbox itself:
// they live in its cgroup and bundle, and nothing of theirs may outlive it.
func (s *taskService) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	if r.ExecID == "" {
		// runc-v2 refuses to delete a paused container; its branches,
		// frozen with it, could not be killed either.
		if sb, err := s.sandboxes.Sandbox(r.ID); err == nil && s.sandboxes.Paused(sb) {
			return nil, errgrpc.ToGRPC(fmt.Errorf("delete %s: %w", r.ID, sandbox.PausedError(sb)))
		}
		lost := s.sandboxes.LostExit(r.ID)
		s.sandboxes.Teardown(ctx, r.ID)
		if lost != nil {
			// Its processes' replacement failed after the task service's
			// task was deleted: the exit is the old init's.
			return &taskAPI.DeleteResponse{Pid: lost.Pid, ExitStatus: lost.ExitStatus, ExitedAt: lost.ExitedAt}, nil
		}
	}
	return s.TTRPCTaskService.Delete(ctx, r)
}

// State of a sandbox whose processes' replacement failed after its task
// was deleted is the old init's exit (see Delete).
func (s *taskService) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	if lost := s.sandboxes.LostExit(r.ID); lost != nil && r.ExecID == "" {
		return &taskAPI.StateResponse{
			ID: r.ID, Bundle: s.sandboxes.Bundle(r.ID), Pid: lost.Pid, Status: tasktypes.Status_STOPPED,
			ExitStatus: lost.ExitStatus, ExitedAt: lost.ExitedAt,
		}, nil
	}
	return s.TTRPCTaskService.State(ctx, r)
}

// Kill is runc-v2's, and then, for a SIGKILL of a sandbox, thaws the
// processes a seal froze (--seal freeze, or a fork that found them
// writing): a frozen process takes no signal, not even SIGKILL, until it
// is thawed, and the sandbox would never stop. The signal is sent first,
// so that the init dies on the thaw without running again.
func (s *taskService) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	resp, err := s.TTRPCTaskService.Kill(ctx, r)
	if err == nil && r.ExecID == "" && r.Signal == uint32(unix.SIGKILL) {
		s.sandboxes.ThawSealForKill(ctx, r.ID)
	}
	return resp, err
}

// Wait for a container's init returns once its branches are gone too (see
// exitPublisher): a stopped sandbox has nothing running. Wait for any
// process returns once its output has been read (awaitDrained). An init that a
// rollback with memory replaced is not an exit: the new one is waited for.
func (s *taskService) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	if r.ExecID != "" {
		resp, err := s.TTRPCTaskService.Wait(ctx, r)
		if err == nil {
			s.awaitDrained(ctx, r.ID, r.ExecID)
		}
		return resp, err
	}
	var (
		resp *taskAPI.WaitResponse
		err  error
	)
	for {
		gen := s.sandboxes.ReplaceGen(r.ID)
		resp, err = s.TTRPCTaskService.Wait(ctx, r)
		again, rerr := s.sandboxes.Replaced(ctx, r.ID, gen)
		if rerr != nil {
			return nil, errgrpc.ToGRPC(fmt.Errorf("wait for %s, whose processes are being replaced: %w", r.ID, rerr))
		}
		if !again {
			break
		}
	}
	if lost := s.sandboxes.LostExit(r.ID); lost != nil {
		resp, err = &taskAPI.WaitResponse{ExitStatus: lost.ExitStatus, ExitedAt: lost.ExitedAt}, nil
	}
	if err != nil {
		return resp, err
	}
	s.awaitDrained(ctx, r.ID, "")
	if err := s.sandboxes.WaitStopped(ctx, r.ID); err != nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("wait for the branches of %s to end: %w", r.ID, err))
	}
	return resp, nil
}

func (s *taskService) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	// Checked here, before anything is mounted or created, so that bad
	// input gets an error of the right kind instead of the runtime's text.
	if err := checkBundle(r); err != nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("create %s: %w", r.ID, err))
	}
	opts := &options.Options{}
	if r.Options.GetValue() != nil {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err != nil {
			return nil, errgrpc.ToGRPC(fmt.Errorf("create %s: runtime options: %v: %w", r.ID, err, errdefs.ErrInvalidArgument))
		}
		o, ok := v.(*options.Options)
		if !ok {
			return nil, errgrpc.ToGRPC(fmt.Errorf("create %s: runtime options of type %T, want runc options: %w", r.ID, v, errdefs.ErrInvalidArgument))
		}
		opts = o
	}
	if err := checkRuncOptions(s.self, opts); err != nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("create %s: %w", r.ID, err))
	}
	// The task service runs its "runc" as BinaryName with --root first;
	// ocirt recognises that command line.
	opts.BinaryName = s.self
	if spec, err := sandbox.ReadSpec(r.Bundle); err == nil && spec.Linux != nil {
		cgroup.KeyDriverOnSpec(ctx, r.ID, spec.Linux.CgroupsPath, opts)
	}
	if opts.Root == "" {
		opts.Root = sandbox.DefaultRoot
	}
	anyOpts, err := typeurl.MarshalAnyToProto(opts)
	if err != nil {
		return nil, fmt.Errorf("create %s: marshal runtime options: %w", r.ID, err)
	}
	r.Options = anyOpts
	b, err := s.sandboxes.BoundsFor(r.Bundle)
	if err != nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("create %s: %w", r.ID, err))
	}
	if err := s.sandboxes.ListenSelfRoot(ctx, r.ID, r.Bundle); err != nil {
		return nil, errgrpc.ToGRPC(fmt.Errorf("create %s: %w", r.ID, err))
	}
	if sealedRootfs(r.Rootfs) {
		// Its snapshot still has live branches, and this new shim runs
		// none: their shim died. They are aborted before the rootfs is
		// mounted, and the rootfs is then mounted writable, as the
		// snapshotter would now mount it: a mount made read-only stays so
		// in the container's mount namespace whatever its superblock does.
		s.sandboxes.AddSandbox(ctx, r, opts, b)
		if s.sandboxes.SettleNew(ctx, r.ID) {
			r.Rootfs = writable(r.Rootfs)
		}
	}
	resp, err := s.TTRPCTaskService.Create(ctx, r)
	if err == nil {
		ns, _ := namespaces.Namespace(ctx)
		if err := sandbox.RecordMember(filepath.Join(opts.Root, ns), r.ID, r.Bundle); err != nil {
			log.G(ctx).WithError(err).WithField("container", r.ID).Error("container not recorded: if this shim is killed, its cleanup will not find it")
		}
		if err := sandbox.KeepOptions(r.Bundle, opts); err != nil {
			log.G(ctx).WithError(err).WithField("container", r.ID).Warn("runtime options not kept: a shim killed in a rollback with processes may leave its cleanup without them")
		}
		s.sandboxes.AddSandbox(ctx, r, opts, b)
	} else {
		s.sandboxes.DropSandbox(ctx, r.ID)
		s.sandboxes.CloseSelfAll(r.ID)
	}
	return resp, err
}

// sealedRootfs says whether a rootfs is an overlay with an upper directory
// mounted read-only: the branch snapshotter's mount of a snapshot sealed
// for its branches.
func sealedRootfs(ms []*types.Mount) bool {
	for _, m := range ms {
		ro, upper := false, false
		for _, o := range m.Options {
			ro = ro || o == "ro"
			upper = upper || strings.HasPrefix(o, "upperdir=")
		}
		if ro && upper {
			return true
		}
	}
	return false
}

// writable is a copy of rootfs mounts with "ro" dropped.
func writable(ms []*types.Mount) []*types.Mount {
	out := make([]*types.Mount, len(ms))
	for i, m := range ms {
		c := &types.Mount{Type: m.Type, Source: m.Source, Target: m.Target}
		for _, o := range m.Options {
			if o != "ro" {
				c.Options = append(c.Options, o)
			}
		}
		out[i] = c
	}
	return out
}

// Exec refuses a stopped or paused container with a failed-precondition
// error; runc-v2's own refusal carries no errdefs kind.
func (s *taskService) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	st, err := s.TTRPCTaskService.State(ctx, &taskAPI.StateRequest{ID: r.ID})
	if err != nil {
		return nil, err
	}
	switch st.Status {
	case tasktypes.Status_STOPPED:
		return nil, errgrpc.ToGRPC(fmt.Errorf("exec %s in %s: container is stopped: %w", r.ExecID, r.ID, errdefs.ErrFailedPrecondition))
	case tasktypes.Status_PAUSED:
		return nil, errgrpc.ToGRPC(fmt.Errorf("exec %s in %s: container is paused: resume it first: %w", r.ExecID, r.ID, errdefs.ErrFailedPrecondition))
	}
	return s.TTRPCTaskService.Exec(ctx, r)
}

// checkBundle validates what the runtime will need from the bundle: a
// readable spec with a runnable process, and a root filesystem that exists
// (or mounts to set one up).
func checkBundle(r *taskAPI.CreateTaskRequest) error {
	b, err := os.ReadFile(filepath.Join(r.Bundle, "config.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no config.json in bundle %s: %w", r.Bundle, errdefs.ErrNotFound)
		}
		return fmt.Errorf("read spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("broken spec in bundle %s: %v: %w", r.Bundle, err, errdefs.ErrInvalidArgument)
	}
	switch {
	case spec.Process == nil:
		return fmt.Errorf("spec has no process: %w", errdefs.ErrInvalidArgument)
	case len(spec.Process.Args) == 0:
		return fmt.Errorf("spec process has no args: %w", errdefs.ErrInvalidArgument)
	case !filepath.IsAbs(spec.Process.Cwd):
		return fmt.Errorf("spec process cwd %q is not absolute: %w", spec.Process.Cwd, errdefs.ErrInvalidArgument)
	case spec.Root == nil || spec.Root.Path == "":
		return fmt.Errorf("spec has no root path: %w", errdefs.ErrInvalidArgument)
	}
	if len(r.Rootfs) > 0 {
		return nil // the task service mounts them at <bundle>/rootfs
	}
	root := spec.Root.Path
	if !filepath.IsAbs(root) {
		root = filepath.Join(r.Bundle, root)
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return fmt.Errorf("rootfs %s: no such directory and no rootfs mounts given: %w", root, errdefs.ErrNotFound)
	}
	return nil
}
