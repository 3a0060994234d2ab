//go:build linux

package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/internal/fifoio"
)

// ExecOptions describes a process to run in a branch.
type ExecOptions struct {
	Args []string
	Env  []string
	Cwd  string
	// Terminal gives the process a pty; Stdout then carries its output and
	// Stderr is unused.
	Terminal bool
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer
	// ID names the process; a unique one is made if empty.
	ID string
}

// Process is a process started in a branch.
type Process struct {
	s      *SandboxClient
	branch string
	ID     string
	Pid    int
	io     *fifoio.IO

	mu   sync.Mutex
	exit *ExitStatus // the shim's answer, once it came
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	Code      int       `json:"exitCode"`
	ExitedAt  time.Time `json:"exitedAt"`
	OOMKilled bool      `json:"oomKilled"`
	// BranchEnded, for a process killed because its branch ended (a
	// sibling's commit made it stale, or it was aborted or committed), says
	// why, as the next call on the branch would.
	BranchEnded string `json:"branchEnded,omitempty"`
}

// Exec starts a process in a branch, its stdio connected through FIFOs as
// containerd's own clients do (internal/fifoio). If ctx ends while it
// starts, Exec returns at once with ctx's error, and the process, if the
// shim starts it all the same, is killed and released.
func (s *SandboxClient) Exec(ctx context.Context, branchID string, opts ExecOptions) (*Process, error) {
	if opts.ID == "" {
		opts.ID = fmt.Sprintf("bx-%d", time.Now().UnixNano())
	}
	p := &Process{s: s, branch: branchID, ID: opts.ID}
	sio, err := fifoio.New(fifoio.Dir, opts.ID, opts.Terminal, opts.Stdin, opts.Stdout, opts.Stderr)
	if err != nil {
		return nil, fmt.Errorf("exec in %s/%s: set up stdio: %w", s.ID, branchID, err)
	}
	p.io = sio
	resp, err := p.start(ctx, &shimv1.ExecRequest{
		Sandbox: s.ID, Branch: branchID, ExecId: opts.ID, Args: opts.Args, Env: opts.Env, Cwd: opts.Cwd,
		Terminal: opts.Terminal, Stdin: sio.StdinPath, Stdout: sio.Stdout, Stderr: sio.Stderr,
	})
	if err != nil {
		return nil, err
	}
	p.Pid = int(resp.Pid)
	// The shim holds the stdin FIFO open until told: EOF is CloseIO, sent
	// once the process exists and its input is written. A terminal's
	// input ends with the terminal.
	afterStdin := func() {}
	if !opts.Terminal {
		afterStdin = func() { _ = p.CloseIO(context.WithoutCancel(ctx)) }
	}
	sio.Start(afterStdin)
	return p, nil
}

// execStartBound bounds an exec's start once its caller has left
// (Process.start).
const execStartBound = time.Minute

// start asks the shim to start p, detached from ctx: if ctx ends first,
// the process, if it starts, is killed and released (abandon).
func (p *Process) start(ctx context.Context, req *shimv1.ExecRequest) (*shimv1.ExecResponse, error) {
	what := fmt.Sprintf("exec in %s/%s", p.s.ID, p.branch)
	return detached(ctx, &p.s.undoing, what, execStartBound, func(ctx context.Context) (*shimv1.ExecResponse, error) {
		resp, err := p.s.api.Exec(p.s.ctx(ctx), req)
		if err != nil {
			p.io.Close()
		}
		return resp, p.s.shimErr(err)
	}, p.abandon)
}

// abandon ends an exec whose caller left while it started: once the
// shim answers, what it started is killed and waited for (the shim then
// forgets it), and its FIFOs go.
func (p *Process) abandon(ctx context.Context, resp *shimv1.ExecResponse, err error) {
	if errors.Is(err, errUnsent) {
		p.io.Close() // never sent
		return
	}
	if err != nil {
		return // start closed its FIFOs
	}
	p.Pid = int(resp.Pid)
	p.end(ctx)
}

// end kills the process and its session, waits for it and releases its
// FIFOs: for a process whose caller left (abandon, Run).
func (p *Process) end(ctx context.Context) {
	if err := p.KillAll(ctx, uint32(syscall.SIGKILL)); err != nil {
		log.G(ctx).WithError(err).Warnf("exec %s in %s/%s, its caller gone: kill", p.ID, p.s.ID, p.branch)
	}
	if _, err := p.Wait(ctx); err != nil {
		log.G(ctx).WithError(err).Warnf("exec %s in %s/%s, its caller gone: wait", p.ID, p.s.ID, p.branch)
	}
	p.Close()
}

// Wait waits for the process to exit and its output to drain: what it
// started and left holding its output (a server put in the background
// with its output not redirected) is waited for too, as a terminal's
// command is. A ctx that ends first ends the wait with its error; Wait
// can be called again, for instance after a KillAll of what holds the
// output.
func (p *Process) Wait(ctx context.Context) (ExitStatus, error) {
	p.mu.Lock()
	st := p.exit
	p.mu.Unlock()
	if st == nil {
		resp, err := p.s.api.Wait(p.s.ctx(ctx), &shimv1.WaitRequest{Sandbox: p.s.ID, Branch: p.branch, ExecId: p.ID})
		if err != nil {
			p.io.Cancel()
			p.release()
			return ExitStatus{}, p.s.shimErr(err)
		}
		st = &ExitStatus{Code: int(resp.ExitStatus), OOMKilled: resp.OomKilled, BranchEnded: resp.BranchEnded}
		if resp.ExitedAt != nil {
			st.ExitedAt = resp.ExitedAt.AsTime()
		}
		// The shim forgets an exec it answered: a later Wait takes this.
		p.mu.Lock()
		p.exit = st
		p.mu.Unlock()
	}
	if err := p.io.Release(ctx); err != nil {
		return ExitStatus{}, err
	}
	return *st, nil
}

// release waits for the copies of the output, which Cancel has ended, and
// lets go of its FIFOs.
func (p *Process) release() {
	_ = p.io.Release(context.Background())
}

// Close releases the process's stdio (its FIFOs) without waiting for it:
// for a process the caller will not wait for, such as one that a commit or
// an abort kills with its branch. After Wait it does nothing.
func (p *Process) Close() {
	p.io.Cancel()
	p.release()
}

// Resize sets the size of the process's terminal.
func (p *Process) Resize(ctx context.Context, width, height uint32) error {
	_, err := p.s.api.ResizePty(p.s.ctx(ctx), &shimv1.ResizePtyRequest{Sandbox: p.s.ID, Branch: p.branch, ExecId: p.ID, Width: width, Height: height})
	return p.s.shimErr(err)
}

// CloseIO closes the process's standard input.
func (p *Process) CloseIO(ctx context.Context) error {
	_, err := p.s.api.CloseIO(p.s.ctx(ctx), &shimv1.CloseIORequest{Sandbox: p.s.ID, Branch: p.branch, ExecId: p.ID})
	return p.s.shimErr(err)
}

// Kill sends a signal to the process.
func (p *Process) Kill(ctx context.Context, sig uint32) error {
	_, err := p.s.api.Kill(p.s.ctx(ctx), &shimv1.KillRequest{Sandbox: p.s.ID, Branch: p.branch, ExecId: p.ID, Signal: sig})
	return p.s.shimErr(err)
}

// KillAll sends a signal to the process and to every process of its
// session: each exec leads one, so this is what it started (a shell's
// commands, a background server), unless that began a session of its
// own. Those that outlive the process are signalled too. A timeout's kill
// wants this: the process alone leaves them running, and its Wait waits
// for the output they hold open.
func (p *Process) KillAll(ctx context.Context, sig uint32) error {
	return p.s.KillSession(ctx, p.branch, p.ID, p.Pid, sig)
}

// KillSession is Process.KillAll of exec execID of a branch, whose pid
// was pid. In branch 0 it signals the processes of the session of an exec
// of the sandbox's containerd task, whose pid containerd gave, but not
// that exec: containerd's kill with all of an exec reaches the exec alone.
func (s *SandboxClient) KillSession(ctx context.Context, branchID, execID string, pid int, sig uint32) error {
	if pid <= 0 || pid > math.MaxInt32 {
		return fmt.Errorf("kill the session of exec %q: pid %d: %w", execID, pid, errdefs.ErrInvalidArgument)
	}
	_, err := s.api.Kill(s.ctx(ctx), &shimv1.KillRequest{Sandbox: s.ID, Branch: branchID, ExecId: execID, Signal: sig, All: true, Pid: uint32(pid)})
	return s.shimErr(err)
}

// Run starts a process in a branch and waits for it. If ctx ends first,
// the process and what it started (its session) are killed and its
// output released, as exec.CommandContext kills its process, and Run
// returns ctx's error.
func (s *SandboxClient) Run(ctx context.Context, branchID string, opts ExecOptions) (ExitStatus, error) {
	p, err := s.Exec(ctx, branchID, opts)
	if err != nil {
		return ExitStatus{}, err
	}
	st, err := p.Wait(ctx)
	if cause := runCut(ctx, err); cause != nil {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killBound)
		defer cancel()
		p.end(kctx)
		return ExitStatus{}, fmt.Errorf("run %v in %s/%s: %w", opts.Args, s.ID, branchID, cause)
	}
	return st, err
}

// runCut says why a Run's wait, which failed with err, was cut short by
// its caller's context: its error, or the deadline where the shim's copy
// of it (ttrpc carries the deadline) ended the wait a moment before ctx's
// own timer did (before, Run then returned that error and left the
// process running, under load). nil if err is nil or not the caller's.
func runCut(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if _, ok := ctx.Deadline(); ok && (errors.Is(err, context.DeadlineExceeded) || errdefs.IsDeadlineExceeded(err)) {
		return context.DeadlineExceeded
	}
	return nil
}

// killBound bounds the kill, and the wait for its exit, of a process
// whose caller's context ended (Run).
const killBound = 10 * time.Second

// Output is a buffer safe for a process's stdout and stderr together:
// containerd's stdio copies them in two goroutines.
type Output struct {
	mu sync.Mutex
	b  []byte
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.b = append(o.b, p...)
	return len(p), nil
}

// String returns what was written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.b)
}
