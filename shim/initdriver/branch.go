//go:build linux

package initdriver

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Branch is a branch run by the init: the init's control socket,
// and the processes it started for the shim.
type Branch struct {
	initProc *Process // the init; its exit comes from the shim's reaper
	ctl      *net.UnixConn
	cfg      *configs.Config

	sendMu sync.Mutex // an exec request and its reply

	mu      sync.Mutex
	byID    map[string]*Process
	byPid   map[int]*Process // by pid in the branch
	waiting []*Process       // sent, not yet given a pid
	closed  bool
}

// read takes the init's reports: pids of started processes and exits.
func (fc *Branch) read(ctx context.Context) {
	buf := make([]byte, 512)
	for {
		k, err := fc.ctl.Read(buf)
		if err != nil || k == 0 {
			break
		}
		m := string(buf[1:k])
		switch buf[0] {
		case 'S':
			pid, _, _ := strings.Cut(m, " ")
			n, _ := strconv.Atoi(pid)
			fc.mu.Lock()
			if len(fc.waiting) == 0 {
				fc.mu.Unlock()
				log.G(ctx).Warnf("branch init reported a start nobody asked for: %q", m)
				continue
			}
			p := fc.waiting[0]
			fc.waiting = fc.waiting[1:]
			if n > 0 {
				p.nspid = n
				fc.byPid[n] = p
			}
			fc.mu.Unlock()
			p.startErr = m
			close(p.startedCh)
		case 'X':
			a, b, _ := strings.Cut(m, " ")
			pid, _ := strconv.Atoi(a)
			ws, _ := strconv.Atoi(b)
			fc.mu.Lock()
			p := fc.byPid[pid]
			delete(fc.byPid, pid)
			fc.mu.Unlock()
			if p != nil {
				p.SetExited(exitStatus(unix.WaitStatus(ws)))
			}
		}
	}
	// The init is gone, and with it every process of the branch.
	fc.mu.Lock()
	fc.closed = true
	left := fc.byPid
	fc.byPid = map[int]*Process{}
	waiting := fc.waiting
	fc.waiting = nil
	fc.mu.Unlock()
	for _, p := range waiting {
		p.startErr = initEndedMsg
		close(p.startedCh)
	}
	for _, p := range left {
		p.SetExited(128 + int(unix.SIGKILL))
	}
}

// initEndedMsg is the start error of a process whose branch's init ended
// before it started it.
const initEndedMsg = "-1 the branch's init ended"

// ErrInitEnded: a process was not started because the branch's init (and
// with it every process of the branch) ended first: the branch was killed
// (aborted, invalidated by a sibling's commit) or its command exited.
var ErrInitEnded = fmt.Errorf("the branch's init ended before the process started: %w", errdefs.ErrFailedPrecondition)

func exitStatus(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// Init is the branch's init process.
func (fc *Branch) Init() *Process { return fc.initProc }

// Pid is the init's pid on the host.
func (fc *Branch) Pid() int { return fc.initProc.Pid() }

// Process is an exec'd process, or the init for "".
func (fc *Branch) Process(id string) (process.Process, error) {
	if id == "" {
		return fc.initProc, nil
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	p, ok := fc.byID[id]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return p, nil
}

func (fc *Branch) Remove(id string) {
	fc.mu.Lock()
	delete(fc.byID, id)
	fc.mu.Unlock()
}

func (fc *Branch) Execd() []process.Process {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	var out []process.Process
	for _, p := range fc.byID {
		out = append(out, p)
	}
	return out
}

// Close ends the control socket, which ends a waiting init.
func (fc *Branch) Close() { fc.ctl.Close() }

// Exec starts a process in the branch through its init.
func (fc *Branch) Exec(ctx context.Context, id string, ps *specs.Process, stdin, stdout, stderr string) (_ process.Process, retErr error) {
	fc.mu.Lock()
	if _, dup := fc.byID[id]; dup {
		fc.mu.Unlock()
		return nil, fmt.Errorf("exec id %s: %w", id, errdefs.ErrAlreadyExists)
	}
	if fc.closed {
		fc.mu.Unlock()
		return nil, fmt.Errorf("the branch's init has ended: %w", errdefs.ErrFailedPrecondition)
	}
	p := newProcess(id, fc)
	p.stdio = stdio.Stdio{Stdin: stdin, Stdout: stdout, Stderr: stderr, Terminal: ps.Terminal}
	fc.byID[id] = p
	fc.mu.Unlock()
	defer func() {
		if retErr != nil {
			fc.Remove(id)
			p.closeIO()
		}
	}()
	var w brinit.Config
	if err := brinit.WriteProc(&w, ps, fc.cfg, true); err != nil {
		return nil, err
	}
	files, err := p.openIO(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	reply, replyTheirs, err := replySocket()
	if err != nil {
		return nil, err
	}
	defer replyTheirs.Close()
	defer reply.Close()
	var rights []int
	for _, f := range files {
		rights = append(rights, int(f.Fd()))
	}
	rights = append(rights, int(replyTheirs.Fd()))
	msg := append([]byte{'E'}, w.Bytes()...)

	if err := fc.send(p, msg, rights); err != nil {
		return nil, fmt.Errorf("ask the branch's init to start %v: %w", ps.Args, err)
	}
	for _, f := range files {
		f.Close()
	}
	files = nil
	replyTheirs.Close()
	// Sent, the process starts whatever the caller does: its start is
	// waited for past ctx, so that what started is known, to be killed
	// (the caller's deadline passed meanwhile: the shim's callerGone).
	bound := time.NewTimer(startBound)
	defer bound.Stop()
	select {
	case <-p.startedCh:
	case <-bound.C:
		return nil, fmt.Errorf("start %v: the branch's init did not answer within %s (frozen?): %w", ps.Args, startBound, errdefs.ErrUnavailable)
	}
	if p.startErr == initEndedMsg {
		return nil, fmt.Errorf("start %v: %w", ps.Args, ErrInitEnded)
	}
	if strings.HasPrefix(p.startErr, "-1") {
		return nil, fmt.Errorf("start %v: %s: %w", ps.Args, strings.TrimSpace(strings.TrimPrefix(p.startErr, "-1")), errdefs.ErrUnknown)
	}
	if err := p.awaitExec(ctx, reply, ps); err != nil {
		return nil, err
	}
	return p, nil
}

// startBound bounds the wait for the init's answer to a start: it
// answers at once unless frozen from outside the shim (a pause goes
// through the shim, which waits for starts under way).
const startBound = time.Minute

// replySocket is the socket pair a process the init starts reports on:
// the shim's end, which takes its credentials, and the process's.
func replySocket() (*net.UnixConn, *os.File, error) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	theirs := os.NewFile(uintptr(sp[1]), "reply-child")
	if err := unix.SetsockoptInt(sp[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(sp[0])
		theirs.Close()
		return nil, nil, err
	}
	replyFile := os.NewFile(uintptr(sp[0]), "reply")
	rc, err := net.FileConn(replyFile)
	replyFile.Close()
	if err != nil {
		theirs.Close()
		return nil, nil, err
	}
	return rc.(*net.UnixConn), theirs, nil
}

// send sends the init an exec request for p, which then waits for the
// init's report of its start; requests and reports go in the same order.
func (fc *Branch) send(p *Process, msg []byte, rights []int) error {
	fc.sendMu.Lock()
	defer fc.sendMu.Unlock()
	fc.mu.Lock()
	fc.waiting = append(fc.waiting, p)
	fc.mu.Unlock()
	if _, _, err := fc.ctl.WriteMsgUnix(msg, unix.UnixRights(rights...), nil); err != nil {
		fc.mu.Lock()
		for i, q := range fc.waiting {
			if q == p {
				fc.waiting = append(fc.waiting[:i], fc.waiting[i+1:]...)
				break
			}
		}
		fc.mu.Unlock()
		return err
	}
	return nil
}

// awaitExec reads what a process the init started reports on reply: its
// host pid, its terminal, and an exec error if there is one; the socket
// closes when it execs.
func (p *Process) awaitExec(ctx context.Context, reply *net.UnixConn, ps *specs.Process) error {
	buf := make([]byte, 2048)
	oob := make([]byte, 256)
	for {
		k, ok, _, _, err := reply.ReadMsgUnix(buf, oob)
		if err != nil || k == 0 {
			break
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:ok])
		switch buf[0] {
		case 'P':
			for _, m := range msgs {
				if cr, err := unix.ParseUnixCredentials(&m); err == nil {
					p.setPid(int(cr.Pid))
				}
			}
		case 'T':
			for _, m := range msgs {
				if fds, err := unix.ParseUnixRights(&m); err == nil {
					for i, fd := range fds {
						if i == 0 && p.console == nil {
							p.console = os.NewFile(uintptr(fd), "pty-master")
						} else {
							unix.Close(fd)
						}
					}
				}
			}
		case 'E':
			_ = p.Wait(ctx)
			return fmt.Errorf("exec in branch: %s: %w", buf[1:k], errdefs.ErrNotFound)
		}
	}
	if p.Pid() <= 0 {
		_ = p.Wait(ctx)
		return fmt.Errorf("start %v: the process ended before it ran: %w", ps.Args, errdefs.ErrUnknown)
	}
	if ps.Terminal {
		if p.console == nil {
			return fmt.Errorf("start %v: no terminal came back: %w", ps.Args, errdefs.ErrUnknown)
		}
		if err := p.copyConsole(); err != nil {
			return err
		}
	}
	return nil
}
