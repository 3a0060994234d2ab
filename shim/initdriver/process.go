//go:build linux

package initdriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/containerd/console"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A process the branch init started, as containerd's process.Process (beside
// the runtime's init and exec processes of containerd's runc shim): its pid,
// exit, signals and stdio.

// Process is a process of a branch run by the init (or the init itself),
// as the shim's process code sees processes.
type Process struct {
	id    string
	fc    *Branch
	stdio stdio.Stdio

	startedCh chan struct{}
	startErr  string
	nspid     int

	mu       sync.Mutex
	pid      int
	pidfd    int
	exited   chan struct{}
	status   int
	exitedAt time.Time

	// stdinHold is a writer of the caller's stdin FIFO the shim holds until
	// CloseIO (as containerd's exec does): the FIFO reaches EOF once it and
	// the caller's writer are closed and what they wrote is read, so an
	// input the caller wrote just before CloseIO is not lost.
	stdinHold io.Closer
	stdinIn   io.Closer // the shim's reader of the FIFO
	console   *os.File
	// consoleOut is the caller's stdout FIFO a terminal's output is
	// copied to, opened before the process starts.
	consoleOut *os.File
	ioDone     sync.WaitGroup
}

func newProcess(id string, fc *Branch) *Process {
	return &Process{id: id, fc: fc, startedCh: make(chan struct{}), exited: make(chan struct{}), pidfd: -1}
}

func (p *Process) setPid(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pid = pid
	select {
	case <-p.exited:
		return
	default:
	}
	// The pidfd pins the process: a signal never reaches a recycled pid.
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		p.pidfd = fd
	}
}

// DupPidfd returns a pidfd of the process of its own, or -1.
func (p *Process) DupPidfd() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pidfd < 0 {
		return -1
	}
	fd, err := unix.FcntlInt(uintptr(p.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

func (p *Process) ID() string { return p.id }

func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

func (p *Process) ExitStatus() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

func (p *Process) ExitedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitedAt
}

func (p *Process) Stdin() io.Closer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdinHold == nil {
		return nil
	}
	return p.stdinHold
}

func (p *Process) Stdio() stdio.Stdio { return p.stdio }

func (p *Process) Status(context.Context) (string, error) {
	select {
	case <-p.exited:
		return "stopped", nil
	default:
		return "running", nil
	}
}

func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Process) Resize(ws console.WinSize) error {
	if p.console == nil {
		return fmt.Errorf("process %s has no terminal: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	return unix.IoctlSetWinsize(int(p.console.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Height, Col: ws.Width})
}

func (p *Process) Start(context.Context) error { return nil }

// Delete lets go of the process's stdio once its output is copied.
func (p *Process) Delete(context.Context) error {
	p.ioDone.Wait()
	p.closeIO()
	return nil
}

func (p *Process) Kill(_ context.Context, sig uint32, _ bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
	default:
	}
	var err error
	if p.pidfd >= 0 {
		err = unix.PidfdSendSignal(p.pidfd, unix.Signal(sig), nil, 0)
	} else if p.pid > 0 {
		err = unix.Kill(p.pid, unix.Signal(sig))
	} else {
		return fmt.Errorf("process %s has not started: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("process already finished: %w", errdefs.ErrNotFound)
	}
	return err
}

func (p *Process) SetExited(status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	p.status = status
	p.exitedAt = time.Now()
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
	close(p.exited)
}

func (p *Process) closeIO() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range []io.Closer{p.stdinHold, p.stdinIn} {
		if c != nil {
			c.Close()
		}
	}
	if p.consoleOut != nil {
		p.consoleOut.Close()
		p.consoleOut = nil
	}
	if p.console != nil {
		p.console.Close()
		p.console = nil
	}
}

// openIO opens the process's stdio: for a terminal, none (its copies run
// through the terminal's master), but the caller's stdout FIFO, which the
// copy of the terminal's output writes to, is opened now, so that an exec
// whose caller is gone fails before it starts rather than write to no
// reader for ever (p.consoleOut); otherwise stdin through a pipe the
// shim feeds from the caller's FIFO (so that closing it, or the FIFO's
// end, ends the process's input), and stdout and stderr as the caller's
// FIFOs themselves, which the process writes straight into.
func (p *Process) openIO(ctx context.Context) ([]*os.File, error) {
	if p.stdio.Terminal {
		if p.stdio.Stdout != "" {
			out, err := openWriteFifo(ctx, p.stdio.Stdout)
			if err != nil {
				return nil, fmt.Errorf("open stdout: %w", err)
			}
			p.mu.Lock()
			p.consoleOut = out
			p.mu.Unlock()
		}
		return nil, nil
	}
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, err
	}
	if p.stdio.Stdin != "" {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		files = append(files, r)
		in, hold, err := openStdinFifo(p.stdio.Stdin)
		if err != nil {
			w.Close()
			return fail(err)
		}
		p.mu.Lock()
		p.stdinIn, p.stdinHold = in, hold
		p.mu.Unlock()
		go func() {
			_, _ = io.Copy(w, in)
			in.Close()
			w.Close()
		}()
	} else {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return fail(err)
		}
		files = append(files, null)
	}
	for _, path := range []string{p.stdio.Stdout, p.stdio.Stderr} {
		if path == "" {
			null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				return fail(err)
			}
			files = append(files, null)
			continue
		}
		f, err := openWriteFifo(ctx, path)
		if err != nil {
			return fail(err)
		}
		files = append(files, f)
	}
	return files, nil
}

// openStdinFifo opens the caller's stdin FIFO for reading, and a writer
// of it the shim holds until CloseIO (Process.stdinHold). Both open at
// once, not blocking (the reader makes the writer's open find one), and
// by path: containerd/fifo reopens a FIFO through /proc/self/fd/N, which
// a concurrent release of another could close and reuse (fifoio).
func openStdinFifo(path string) (in, hold *os.File, err error) {
	in, err = os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open stdin %s: %w", path, err)
	}
	hold, err = os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		in.Close()
		return nil, nil, fmt.Errorf("open stdin %s: %w", path, err)
	}
	return in, hold, nil
}

// openWriteFifo opens the writing end of a caller's FIFO, waiting (within
// ctx) for its reader if it has none yet, in blocking mode for the process.
func openWriteFifo(ctx context.Context, path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENXIO) {
		type res struct {
			f   *os.File
			err error
		}
		ch := make(chan res, 1)
		go func() {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			ch <- res{f, err}
		}()
		select {
		case r := <-ch:
			if r.err != nil {
				return nil, fmt.Errorf("open %s: %w", path, r.err)
			}
			return r.f, nil
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.f != nil {
					r.f.Close()
				}
			}()
			return nil, fmt.Errorf("open %s: no reader: %w", path, ctx.Err())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// copyConsole copies between the caller's FIFOs and the terminal's master.
func (p *Process) copyConsole() error {
	p.mu.Lock()
	out := p.consoleOut
	p.consoleOut = nil
	p.mu.Unlock()
	if out != nil {
		master := p.console
		p.ioDone.Add(1)
		go func() {
			defer p.ioDone.Done()
			// Ends with EIO when the terminal's last user goes, or EPIPE
			// when the caller's reader does.
			_, _ = io.Copy(out, master)
			out.Close()
		}()
	}
	if p.stdio.Stdin != "" {
		in, hold, err := openStdinFifo(p.stdio.Stdin)
		if err != nil {
			return err
		}
		master := p.console
		p.mu.Lock()
		p.stdinIn, p.stdinHold = in, hold
		p.mu.Unlock()
		go func() {
			_, _ = io.Copy(master, in)
		}()
	}
	return nil
}
