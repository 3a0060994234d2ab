//go:build linux

package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/branch"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"

	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/containerd/console"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Exec starts a process in a branch.
func (c *Service) Exec(ctx context.Context, req *shimv1.ExecRequest) (_ *shimv1.ExecResponse, retErr error) {
	ctx, stop := callerDeadline(ctx)
	defer stop()
	defer func() { retErr = toTTRPC(retErr) }()
	if len(req.Args) == 0 {
		return nil, fmt.Errorf("exec: no command given: %w", errdefs.ErrInvalidArgument)
	}
	if req.ExecId == "" {
		return nil, fmt.Errorf("exec: no exec id given: %w", errdefs.ErrInvalidArgument)
	}
	sb, n, err := c.branchFor(ctx, req.Sandbox, req.Branch, true, true)
	if err != nil {
		return nil, err
	}
	defer sb.active()() // sb.mu is held here
	ctx = withNS(ctx, sb)
	if n.state.has(exited) {
		sb.mu.Unlock()
		return nil, fmt.Errorf("exec in %s/%s: its command exited, so its namespaces are gone; abort it or fork again: %w", sb.id, n.id, errdefs.ErrFailedPrecondition)
	}
	if n.state.has(held) {
		sb.mu.Unlock()
		return nil, fmt.Errorf("exec in %s/%s: it is frozen until the snapshotter answers and says whether its commit was made; call commit again to learn it: %w", sb.id, n.id, errdefs.ErrFailedPrecondition)
	}
	if n.state.has(sealFrozen) && n.init != nil {
		// Its init, which starts its processes, is frozen with the rest:
		// the request would wait for the thaw, and run after its caller
		// gave up.
		sb.mu.Unlock()
		return nil, fmt.Errorf("exec in %s/%s: its processes are frozen while it has branches (forked with --seal freeze); commit or abort its branches first: %w", sb.id, n.id, errdefs.ErrFailedPrecondition)
	}
	ps := *n.spec.Process
	ps.Args = req.Args
	ps.Env = append(append([]string{}, ps.Env...), req.Env...)
	if req.Cwd != "" {
		ps.Cwd = req.Cwd
	}
	ps.Terminal = req.Terminal
	// The process starts outside the sandbox's lock; a Pause waits for it,
	// as a process starting in a frozen branch would wait for the resume.
	sb.starting.add()
	defer sb.starting.done()
	if fc := n.init; fc != nil {
		sb.mu.Unlock()
		p, err := fc.Exec(ctx, req.ExecId, &ps, req.Stdin, req.Stdout, req.Stderr)
		if err != nil {
			return nil, c.execFailed(ctx, sb, n, req.Args, err)
		}
		if err := c.callerGone(ctx, sb, n, p, fc.Remove); err != nil {
			return nil, err
		}
		return &shimv1.ExecResponse{Pid: uint32(p.Pid())}, nil
	}
	return c.execByRuntime(ctx, sb, n, req, &ps)
}

// execByRuntime is Exec of a branch the runtime runs (no branch init);
// sb.mu is held, and released here.
func (c *Service) execByRuntime(ctx context.Context, sb *Sandbox, n *Branch, req *shimv1.ExecRequest, ps *specs.Process) (*shimv1.ExecResponse, error) {
	b, err := json.Marshal(ps)
	if err != nil {
		sb.mu.Unlock()
		return nil, err
	}
	container := n.container
	// The sandbox stays unlocked while the process starts: a commit waits
	// only for the bookkeeping, and kills what it finds in the cgroup.
	ok, cancel := container.ReserveProcess(req.ExecId)
	sb.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("exec id %s already used in %s/%s: %w", req.ExecId, sb.id, n.id, errdefs.ErrAlreadyExists)
	}
	p, err := container.Exec(ctx, &taskAPI.ExecProcessRequest{
		ID: n.runtimeID, ExecID: req.ExecId, Terminal: req.Terminal,
		Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr,
		Spec: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Process", Value: b},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("exec in %s/%s: %w", sb.id, n.id, errgrpc.ToNative(err))
	}
	cancel()
	started := time.Now()
	// Not cut short with ctx: the runtime killed midway may have started
	// the process already (see callerGone).
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), execStartBound)
	defer scancel()
	if err := p.Start(sctx); err != nil {
		container.ProcessRemove(req.ExecId)
		return nil, c.execFailed(ctx, sb, n, req.Args, errgrpc.ToNative(err))
	}
	c.watch(p, started)
	if err := c.callerGone(ctx, sb, n, p, container.ProcessRemove); err != nil {
		return nil, err
	}
	return &shimv1.ExecResponse{Pid: uint32(p.Pid())}, nil
}

// execStartBound bounds the runtime's start of an exec.
const execStartBound = time.Minute

// callerGone kills an exec that started after its caller's context ended
// (its deadline, which ttrpc carries here, passed during the start): the
// reply is lost, and the process would run on with nobody knowing of it,
// as a Go client's Run past its deadline left it under load. What it
// started goes with it (its session), and the caller's error is returned.
// Nobody will wait for it either: once it has exited it is forgotten
// (remove), so that its exec id can be used again, as after a Wait.
func (c *Service) callerGone(ctx context.Context, sb *Sandbox, n *Branch, p process.Process, remove func(string)) error {
	cause := ctx.Err()
	if cause == nil {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	log.G(ctx).WithFields(log.Fields{"sandbox": sb.id, "branch": n.id, "exec": p.ID()}).Info("exec's caller left while it started: killed")
	if err := c.killAll(ctx, n.cgroup, p, uint32(unix.SIGKILL)); err != nil {
		log.G(ctx).WithError(err).WithField("exec", p.ID()).Warn("kill an exec whose caller left while it started")
	}
	go func() {
		wctx, cancel := context.WithTimeout(ctx, execForgetBound)
		defer cancel()
		if err := p.Wait(wctx); err != nil {
			// Its branch's end forgets it, or a caller's Wait.
			log.G(ctx).WithError(err).WithField("exec", p.ID()).Warn("wait for an exec whose caller left while it started")
			return
		}
		_ = p.Delete(wctx)
		remove(p.ID())
	}()
	return fmt.Errorf("exec in %s/%s: its caller left while it started, and it was killed: %w", sb.id, n.id, cause)
}

// execForgetBound bounds the wait for a killed exec nobody waits for.
const execForgetBound = 10 * time.Second

// proc finds an exec'd process ("" is the branch's init); with write
// (a signal), not in a paused sandbox.
// The returned remove forgets an exec'd process once it is waited for.
func (c *Service) proc(ctx context.Context, sandboxID, id, execID string, write bool) (*Branch, func(string), process.Process, error) {
	sb, n, err := c.branchFor(ctx, sandboxID, id, true, write)
	if err != nil {
		return nil, nil, nil, err
	}
	procs := n.procs()
	var remove func(string)
	switch {
	case n.init != nil:
		remove = n.init.Remove
	case n.container != nil:
		remove = n.container.ProcessRemove
	}
	sb.mu.Unlock()
	if procs == nil {
		return nil, nil, nil, fmt.Errorf("branch %s of %s is gone: %w", id, sandboxID, errdefs.ErrNotFound)
	}
	p, err := procs.Process(execID)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("process %q of %s/%s: %w", execID, sandboxID, id, errdefs.ErrNotFound)
	}
	return n, remove, p, nil
}

// Wait waits for an exec'd process to exit and reports whether the kernel's
// OOM killer ended it.
func (c *Service) Wait(ctx context.Context, req *shimv1.WaitRequest) (_ *shimv1.WaitResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	n, remove, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, false)
	if err != nil {
		if sb, serr := c.Sandbox(req.Sandbox); serr == nil && req.ExecId != "" {
			if resp := sb.takeWaited(req.Branch, req.ExecId); resp != nil {
				return resp, nil
			}
			if p := sb.takeEnded(req.Branch, req.ExecId); p != nil {
				// Its branch ended (and killed it) before this Wait came.
				if err := p.Wait(ctx); err != nil {
					return nil, err
				}
				resp := &shimv1.WaitResponse{ExitStatus: uint32(p.ExitStatus()), ExitedAt: timestamppb.New(p.ExitedAt())}
				c.whyKilled(ctx, req, resp)
				return resp, nil
			}
		}
		return nil, err
	}
	if err := p.Wait(ctx); err != nil {
		return nil, err
	}
	status := p.ExitStatus()
	resp := &shimv1.WaitResponse{ExitStatus: uint32(status), ExitedAt: timestamppb.New(p.ExitedAt())}
	// SIGKILL with OOM kills counted in the branch's memory cgroup.
	if status == 128+int(unix.SIGKILL) {
		if ms, err := c.cgroups.Mounts(); err == nil {
			resp.OomKilled = cgroup.OOMKillsIn(cgroup.DirsIn(ms, n.cgroup)) > 0
		}
		if !resp.OomKilled {
			c.whyKilled(ctx, req, resp)
		}
	}
	if req.ExecId != "" {
		if sb, err := c.Sandbox(req.Sandbox); err == nil {
			sb.keepWaited(req.Branch, req.ExecId, resp)
		}
		_ = p.Delete(ctx)
		remove(req.ExecId)
	}
	return resp, nil
}

// whyKilled says, in a killed process's answer, whether its branch's end
// killed it. The end's kill and its record are one step under the
// sandbox's lock, which branchEnded waits for: a process killed by it is
// answered once the branch is recorded ended.
func (c *Service) whyKilled(ctx context.Context, req *shimv1.WaitRequest, resp *shimv1.WaitResponse) {
	if resp.ExitStatus != 128+uint32(unix.SIGKILL) {
		return
	}
	if err := c.branchEnded(ctx, req.Sandbox, req.Branch); err != nil {
		resp.BranchEnded = err.Error()
	}
}

func (c *Service) ResizePty(ctx context.Context, req *shimv1.ResizePtyRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	_, _, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, false)
	if err != nil {
		return nil, err
	}
	if err := p.Resize(console.WinSize{Width: uint16(req.Width), Height: uint16(req.Height)}); err != nil {
		return nil, err
	}
	return &shimv1.Empty{}, nil
}

func (c *Service) CloseIO(ctx context.Context, req *shimv1.CloseIORequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	_, _, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, false)
	if err != nil {
		return nil, err
	}
	if stdin := p.Stdin(); stdin != nil {
		if err := stdin.Close(); err != nil {
			return nil, fmt.Errorf("close stdin: %w", err)
		}
	}
	return &shimv1.Empty{}, nil
}

func (c *Service) Kill(ctx context.Context, req *shimv1.KillRequest) (_ *shimv1.Empty, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	if err := checkSignal(req.Signal); err != nil {
		return nil, err
	}
	if req.All && req.Branch == branch.RootID {
		return c.killTaskSession(ctx, req)
	}
	n, _, p, err := c.proc(ctx, req.Sandbox, req.Branch, req.ExecId, true)
	if req.All && req.ExecId != "" {
		if err != nil && errdefs.IsNotFound(err) && req.Pid > 0 {
			return c.killWaited(ctx, req, err)
		}
		if err != nil {
			return nil, err
		}
		if err := c.killAll(ctx, n.cgroup, p, req.Signal); err != nil {
			return nil, errgrpc.ToNative(err)
		}
		return &shimv1.Empty{}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := p.Kill(ctx, req.Signal, false); err != nil {
		return nil, errgrpc.ToNative(err)
	}
	return &shimv1.Empty{}, nil
}
