//go:build linux

package ops

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/fifoio"
)

// Process is a process started in a branch.
type Process interface {
	// Wait waits for it to exit and its output to drain.
	Wait(ctx context.Context) (client.ExitStatus, error)
	Kill(ctx context.Context, sig uint32) error
	// KillAll signals its session too (client.Process.KillAll).
	KillAll(ctx context.Context, sig uint32) error
}

// Exec starts a process in a branch of the sandbox. The shim runs
// processes in branches; one in the sandbox itself (branch "0") is an
// exec of its containerd task, as `ctr task exec` makes one.
//
// The start runs to its end (within startBound) even if ctx ends midway:
// the process may be started all the same by then, and the caller's
// Wait, with its ctx ended, is what kills it and answers with its exit (a
// server stopped under a start answered "context canceled" and left the
// process running).
func Exec(ctx context.Context, cc *containerd.Client, sc *client.SandboxClient, branchID string, opts client.ExecOptions) (Process, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startBound)
	defer cancel()
	if branchID == branch.RootID || branchID == "" {
		return execRoot(ctx, cc, sc, opts)
	}
	return sc.Exec(ctx, branchID, opts)
}

// startBound bounds an exec's start, containerd's absence included
// (startPatience).
const startBound = time.Minute

type rootProcess struct {
	p containerd.Process
	// ns is the sandbox's namespace: the caller's context of Wait and
	// Kill has none, and containerd's calls need it.
	ns string
	sc *client.SandboxClient

	exited   chan struct{} // closed once status is set
	status   containerd.ExitStatus
	released chan struct{} // closed once release is done
}

// ownPatience bounds how long an exec's owner (own) waits for containerd
// to answer again, for its exit and for its delete.
const ownPatience = time.Hour

// execRoot starts opts in the sandbox's own task.
func execRoot(ctx context.Context, cc *containerd.Client, sc *client.SandboxClient, opts client.ExecOptions) (Process, error) {
	ctx = namespaces.WithNamespace(ctx, sc.Namespace)
	sandboxID := sc.ID
	c, err := cc.LoadContainer(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		return nil, err
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s has no task to exec in: %w", sandboxID, err)
	}
	ps := *spec.Process
	ps.Terminal = false
	ps.Args = opts.Args
	ps.Env = append(append([]string{}, ps.Env...), opts.Env...)
	if opts.Cwd != "" {
		ps.Cwd = opts.Cwd
	}
	id := fmt.Sprintf("api-%d", time.Now().UnixNano())
	rp := &rootProcess{ns: sc.Namespace, sc: sc}
	// The FIFOs as the client makes a branch's (internal/fifoio), not
	// through containerd's cio, whose release of a FIFO never opened can
	// close another exec's.
	var sio fifoCIO
	creator := func(id string) (cio.IO, error) {
		s, err := fifoio.New(fifoio.Dir, id, false, opts.Stdin, opts.Stdout, opts.Stderr)
		if err != nil {
			return nil, err
		}
		sio = fifoCIO{IO: s, held: &atomic.Bool{}}
		return sio, nil
	}
	p, err := task.Exec(ctx, id, &ps, creator)
	if err != nil {
		return nil, err
	}
	// Wait is set up before Start, so that a fast exit is not missed.
	exit, err := p.Wait(context.WithoutCancel(ctx))
	if err != nil {
		_, _ = p.Delete(context.WithoutCancel(ctx))
		return nil, err
	}
	// containerd closes the IO of a start that failed: held until it is
	// known whether the process started all the same (startedAnyway).
	sio.held.Store(true)
	err = p.Start(ctx)
	sio.held.Store(false)
	if err != nil {
		started, lerr := startedAnyway(ctx, task, id, err, sio)
		if lerr != nil {
			sio.Cancel()
			sio.Wait()
			sio.Close()
			_, _ = p.Delete(context.WithoutCancel(ctx))
			return nil, err
		}
		p = started
	}
	// The task's stdin FIFO stays open until CloseIO: EOF is sent once
	// the input is written.
	sio.Start(func() { _ = p.CloseIO(context.WithoutCancel(ctx), containerd.WithStdinCloser) })
	rp.p, rp.exited, rp.released = p, make(chan struct{}), make(chan struct{})
	go rp.own(namespaces.WithNamespace(context.WithoutCancel(ctx), rp.ns), exit)
	return rp, nil
}

// startPatience bounds how long an exec whose start lost its answer waits
// for containerd to say whether it started.
const startPatience = 30 * time.Second

// startedAnyway is the exec id of task as containerd has it once it
// answers again, if a start that failed because containerd went away (a
// restart) had started it: the shim ran it, and only the answer was lost.
// Otherwise it returns startErr.
func startedAnyway(ctx context.Context, task containerd.Task, id string, startErr error, pio cio.IO) (containerd.Process, error) {
	if !unavailable(startErr) {
		return nil, startErr
	}
	giveUp := time.Now().Add(startPatience)
	for pause := 100 * time.Millisecond; time.Now().Before(giveUp); pause = min(2*pause, time.Second) {
		select {
		case <-ctx.Done():
			return nil, startErr
		case <-time.After(pause):
		}
		// Loaded again for its pid, which only the start's answer gave.
		p, err := task.LoadProcess(ctx, id, func(*cio.FIFOSet) (cio.IO, error) { return pio, nil })
		var st containerd.Status
		if err == nil {
			st, err = p.Status(ctx)
		}
		switch {
		case err == nil && st.Status != containerd.Created:
			return p, nil
		case err == nil:
			return nil, startErr // not started
		case !unavailable(err):
			return nil, startErr
		}
	}
	return nil, startErr
}

// own waits for the exit, asking containerd again while it is away (a
// restart), then releases the exec: whether or not a caller still waits
// (its client gone, its timeout passed while containerd was away), the
// exec is deleted once it exited and containerd answers, and its FIFOs
// are closed.
func (rp *rootProcess) own(ctx context.Context, exit <-chan containerd.ExitStatus) {
	defer close(rp.released)
	giveUp := time.Now().Add(ownPatience)
	for {
		s, ok := <-exit
		if err := s.Error(); ok && err != nil && unavailable(err) && time.Now().Before(giveUp) {
			exit = rp.rewait(ctx, giveUp)
			continue
		}
		rp.status = s
		close(rp.exited)
		break
	}
	rp.release(ctx, giveUp)
}

// Wait waits for the exit and the release (own); a ctx that ends first
// ends it, and Wait can be called again (after a KillAll).
func (rp *rootProcess) Wait(ctx context.Context) (client.ExitStatus, error) {
	for _, ch := range []chan struct{}{rp.exited, rp.released} {
		select {
		case <-ch:
		case <-ctx.Done():
			return client.ExitStatus{}, ctx.Err()
		}
	}
	if err := rp.status.Error(); err != nil {
		return client.ExitStatus{}, err
	}
	return client.ExitStatus{Code: int(rp.status.ExitCode()), ExitedAt: rp.status.ExitTime()}, nil
}

// rewait asks containerd again for the exec's exit until it answers, at
// growing intervals (gRPC fails calls at once while it reconnects), or
// until giveUp: then the channel says containerd is unavailable.
func (rp *rootProcess) rewait(ctx context.Context, giveUp time.Time) <-chan containerd.ExitStatus {
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		time.Sleep(pause)
		exit, err := rp.p.Wait(ctx)
		if err == nil {
			return exit
		}
		if !unavailable(err) || !time.Now().Before(giveUp) {
			ch := make(chan containerd.ExitStatus, 1)
			ch <- *containerd.NewExitStatus(containerd.UnknownExitStatus, time.Time{}, err)
			return ch
		}
	}
}

// release deletes the exited exec once its output has drained.
// containerd's Delete closes the FIFOs before it waits for their copies,
// so output still in a FIFO would be lost (an exit with no output, seen
// under load): the task's side closes its write ends once the process's
// output ends, and the copies are waited for first. A process that left a
// child holding its output is waited for a while, as runc-v2's own Delete
// waits for its copies. Right after the exit the task may not report the
// exec stopped yet (Delete is then refused): it is asked again.
func (rp *rootProcess) release(ctx context.Context, giveUp time.Time) {
	if pio := rp.p.IO(); pio != nil {
		drained := make(chan struct{})
		go func() {
			pio.Wait()
			close(drained)
		}()
		select {
		case <-drained:
		case <-time.After(5 * time.Second):
		}
	}
	var err error
	for i, pause := 0, 100*time.Millisecond; i < 100; i++ {
		_, err = rp.p.Delete(ctx)
		if err != nil && unavailable(err) && time.Now().Before(giveUp) {
			// containerd away: deleted once it is back.
			time.Sleep(pause)
			pause, i = min(2*pause, time.Second), 0
			continue
		}
		if err == nil || !errdefs.IsFailedPrecondition(err) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("exec", rp.p.ID()).Warn("delete an exec of the sandbox's task")
		// Its FIFOs are the server's to close all the same.
		if pio := rp.p.IO(); pio != nil {
			pio.Cancel()
			pio.Close()
		}
	}
}

func (rp *rootProcess) Kill(ctx context.Context, sig uint32) error {
	ctx = namespaces.WithNamespace(ctx, rp.ns)
	return rp.p.Kill(ctx, syscall.Signal(sig))
}

// KillAll is Kill, then the shim's kill of the exec's session:
// containerd sends a kill with all of an exec to the exec alone.
func (rp *rootProcess) KillAll(ctx context.Context, sig uint32) error {
	// containerd away (a restart) holds its calls until it is back: the
	// shim's kill of the session, which the exec leads, does not wait
	// for it.
	kctx, cancel := context.WithTimeout(ctx, killPatience)
	err := rp.Kill(kctx, sig)
	cancel()
	serr := rp.sc.KillSession(ctx, branch.RootID, rp.p.ID(), int(rp.p.Pid()), sig)
	switch {
	case serr == nil:
		return nil // the session signalled, the exec with it
	case err != nil:
		return err // neither the exec nor any of its session was there
	case errdefs.IsNotFound(serr):
		return nil // the exec signalled, alone in its session
	}
	return serr
}

// killPatience bounds containerd's kill of an exec in KillAll.
const killPatience = 2 * time.Second

// fifoCIO is containerd's cio.IO over fifoio's FIFOs. While held,
// containerd's own cancel, wait and close of it are not done.
type fifoCIO struct {
	*fifoio.IO
	held *atomic.Bool
}

func (f fifoCIO) Config() cio.Config {
	return cio.Config{Stdin: f.StdinPath, Stdout: f.Stdout, Stderr: f.Stderr}
}

func (f fifoCIO) Cancel() {
	if !f.held.Load() {
		f.IO.Cancel()
	}
}

func (f fifoCIO) Wait() {
	if !f.held.Load() {
		f.IO.Wait()
	}
}

func (f fifoCIO) Close() error {
	if !f.held.Load() {
		f.IO.Close()
	}
	return nil
}

// unavailable is whether err says containerd is away, as its client
// returns it (native) or as gRPC does: errgrpc.ToNative of a native error
// makes it unknown.
func unavailable(err error) bool {
	return errdefs.IsUnavailable(err) || errdefs.IsUnavailable(errgrpc.ToNative(err))
}

// Ended says whether ctx is done or past its deadline: a timed wait can
// fail with the deadline before ctx says so (the shim's end of the call
// has the same deadline, and under load its timer can fire first), and
// the process must then be killed all the same.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
