//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
	cgmanager "github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/cgroup"
)

// The branch init's driver: an init spawned in its cgroups, configured over
// its socket, and the processes it starts and reports.

// fastCtx is a branch context run by the init: the init's control socket,
// and the processes it started for the shim.
type fastCtx struct {
	init *fastProc // the init; its exit comes from the shim's reaper
	ctl  *net.UnixConn
	cfg  *configs.Config

	sendMu sync.Mutex // an exec request and its reply

	mu      sync.Mutex
	byID    map[string]*fastProc
	byPid   map[int]*fastProc // by pid in the branch
	waiting []*fastProc       // sent, not yet given a pid
	closed  bool
}

// spawned is a branch init started in new namespaces and being moved into
// its cgroup, waiting for its instructions.
type spawned struct {
	init   *fastProc
	ctl    *net.UnixConn
	cgroup string            // its cgroup path
	paths  map[string]string // its cgroup's directories, by controller
	flags  uintptr           // the namespaces it was cloned with
	joined chan error        // the move into the cgroup, once done
	// prepped is the early part of a plan it ran (splitPrep), or nil.
	prepped []byte
}

// spawn makes a cgroup and starts an init in new namespaces (flags),
// inside the cgroup's pids and memory cgroups (startIn), so that the
// process limits above it hold from its first instant. On the other v1
// hierarchies it is moved in the background while it can already build
// a root; a fork refused by a process limit is a *PidsLimit.
func (c *Service) spawn(ctx context.Context, cgroupPath string, flags uintptr) (_ *spawned, retErr error) {
	// Also done by the fork; the pool starts inits between forks.
	if err := cgroup.PrepareBranchParent(ctx, filepath.Dir(cgroupPath)); err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	cgm, err := cgmanager.New(&cgroups.Cgroup{Path: cgroupPath, Resources: &cgroups.Resources{}})
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	// The new cgroup (devices included) starts with what its parent
	// allows, and its parent's limits bound it.
	if err := cgm.Apply(-1); err != nil {
		return nil, fmt.Errorf("make cgroup %s: %w", cgroupPath, err)
	}
	defer func() {
		if retErr != nil {
			_ = cgm.Destroy()
		}
	}()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "branch-ctl"), os.NewFile(uintptr(fds[1]), "branch-ctl-init")
	defer theirs.Close()
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, err
	}
	ctl := conn.(*net.UnixConn)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		ctl.Close()
		return nil, err
	}
	defer null.Close()
	started := time.Now()
	pidfd := -1
	paths := cgm.GetPaths()
	pid, born, err := c.cgroups.StartIn(ctx, cgroupPath, paths, c.init, []string{"brinit"}, &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{},
		Files: []uintptr{null.Fd(), null.Fd(), null.Fd(), theirs.Fd()},
		Sys:   &syscall.SysProcAttr{Cloneflags: flags, PidFD: &pidfd},
	})
	if err != nil {
		ctl.Close()
		var pl *cgroup.PidsLimit
		if errors.As(err, &pl) {
			return nil, err
		}
		return nil, fmt.Errorf("start the branch init: %w", err)
	}
	init := newFastProc("", nil)
	init.pid, init.pidfd = pid, pidfd
	c.watch(init, started)
	s := &spawned{init: init, ctl: ctl, cgroup: cgroupPath, paths: paths, flags: flags, joined: make(chan error, 1)}
	var rest []string // the hierarchies it was not born in
	for _, dir := range paths {
		if !born[dir] && !slices.Contains(rest, dir) {
			rest = append(rest, dir)
		}
	}
	if len(rest) == 0 {
		s.joined <- nil
		return s, nil
	}
	go func() {
		for _, dir := range rest {
			if err := cgroups.WriteCgroupProc(dir, pid); err != nil {
				s.joined <- fmt.Errorf("put the branch init in cgroup %s: %w", dir, err)
				return
			}
		}
		s.joined <- nil
	}()
	return s, nil
}

// waitJoined waits for the init's move into its cgroup and says how it
// went; the answer stays for later callers.
func (s *spawned) waitJoined() error {
	err := <-s.joined
	s.joined <- err
	return err
}

// joinedYet says, without waiting, whether the init's move into its
// cgroup is done, and how it went.
func (s *spawned) joinedYet() (bool, error) {
	select {
	case err := <-s.joined:
		s.joined <- err
		return true, err
	default:
		return false, nil
	}
}

// ended says whether the init has exited (killed while it waited, say by
// the sandbox's OOM killer).
func (s *spawned) ended() bool {
	select {
	case <-s.init.exited:
		return true
	default:
		return false
	}
}

// discard kills an init that will not be a branch's and removes its
// cgroup.
func (s *spawned) discard(ctx context.Context) {
	_ = s.init.Kill(ctx, uint32(unix.SIGKILL), false)
	s.ctl.Close()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_ = s.init.Wait(wctx)
	cancel()
	_ = s.waitJoined() // the move must not recreate what is removed
	if err := cgroups.RemovePaths(s.paths); err != nil {
		log.G(ctx).WithError(err).WithField("cgroup", s.cgroup).Warn("remove the cgroup of a discarded branch init")
	}
}

// rename gives a spawned init's cgroup the path a branch's would have, so
// that a pre-started init looks like any other branch's. A v1 hierarchy
// renames the cgroup; cgroup2 cannot (EPERM, also the unified hierarchy of
// a hybrid host), and there the init is moved into a new cgroup of that
// name instead. On failure, paths still name the init's cgroups, for
// discard.
func (s *spawned) rename(to string) error {
	done := map[string]string{} // co-mounted controllers share a directory
	for ctrl, dir := range s.paths {
		nd, ok := done[dir]
		if !ok {
			nd = filepath.Join(filepath.Dir(dir), filepath.Base(to))
			err := os.Rename(dir, nd)
			if errors.Is(err, unix.EPERM) {
				err = moveInto(dir, nd, s.init.Pid())
			}
			if err != nil {
				return fmt.Errorf("rename cgroup %s to %s: %w", dir, nd, err)
			}
			done[dir] = nd
		}
		s.paths[ctrl] = nd
	}
	s.cgroup = to
	return nil
}

// moveInto moves pid from the cgroup dir into a new one, nd, and removes
// dir.
func moveInto(dir, nd string, pid int) error {
	if err := os.Mkdir(nd, 0o755); err != nil {
		return err
	}
	if err := cgroups.WriteCgroupProc(nd, pid); err != nil {
		_ = unix.Rmdir(nd)
		return err
	}
	for try := 0; ; try++ {
		// The move is done; a moment may pass before the old cgroup is
		// free. One still busy after 50 ms goes with the sandbox's.
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) || try == 50 {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}

// configure has a spawned init build a branch's root and start its
// command; it returns once the branch is ready or the init said why not.
func (c *Service) configure(ctx context.Context, sb *sandbox, n *bctx, s *spawned, rootfs string, cmdLog string) (_ *fastCtx, retErr error) {
	defer func() {
		if retErr != nil {
			s.discard(ctx)
		}
	}()
	if err := cgroup.SetLimits(s.paths, n.limits); err != nil {
		return nil, fmt.Errorf("branch %s: set limits: %w", n.id, err)
	}
	var prog *compiledSeccomp
	if n.spec.Linux.Seccomp != nil {
		// Compiled when the sandbox chose the init (useInit).
		var err error
		if prog, err = sb.initPath.seccomp(ctx, n.spec.Linux.Seccomp); err != nil {
			return nil, fmt.Errorf("branch %s: %w", n.id, err)
		}
	}
	var sc *brinit.Seccomp
	if prog != nil {
		sc = &prog.Seccomp
	}
	plan, err := brinit.NewPlan(n.spec, rootfs, s.paths, sc)
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", n.id, err)
	}
	if plan.Clone != s.flags {
		return nil, fmt.Errorf("branch %s: its init was started with namespaces %#x, the spec wants %#x: %w", n.id, s.flags, plan.Clone, errdefs.ErrInternal)
	}
	// The init attaches a clone of the shim's rootfs mount: it may have
	// been started (its mount namespace copied) before the rootfs was
	// mounted.
	rootMnt, err := unix.OpenTree(unix.AT_FDCWD, rootfs, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("branch %s: clone its rootfs mount: %w", n.id, err)
	}
	defer unix.Close(rootMnt)
	fds := []int{rootMnt}
	conf := &plan.Conf
	if s.prepped != nil {
		// An init started ahead did the early part already: if it is
		// this plan's (it is, unless the sandbox's namespaces moved), it
		// gets the rest; otherwise all of it, and drops what it made.
		if early, late, ok := brinit.SplitPrep(plan.Conf.Ops()); ok && bytes.Equal(early.Bytes(), s.prepped) {
			conf = &late
			log.G(ctx).WithField("branch", n.id).Debug("the branch's init, started ahead, made the early part of its root")
		}
	}
	if n.hasCommand {
		if err := brinit.WriteProc(conf, n.spec.Process, plan.Cfg, false); err != nil {
			return nil, err
		}
		conf.Op("run")
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		defer null.Close()
		out, err := os.OpenFile(cmdLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("branch %s: command log: %w", n.id, err)
		}
		defer out.Close()
		fds = append(fds, int(null.Fd()), int(out.Fd()), int(out.Fd()))
	}
	if prog != nil {
		fds = append(fds, int(prog.file.Fd())) // last: the seccomp op (brinit.NewPlan)
	}
	oob := unix.UnixRights(fds...)
	ctl := s.ctl
	// An init in its cgroups already (one started ahead) goes on from its
	// root to the command without waiting for a word: one round trip
	// less.
	joined, err := s.joinedYet()
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", n.id, err)
	}
	if joined {
		conf.Op("joined")
	}
	msg := append([]byte{'C'}, conf.Bytes()...)
	if _, _, err := ctl.WriteMsgUnix(msg, oob, nil); err != nil {
		return nil, fmt.Errorf("branch %s: send its init the branch's set-up: %w", n.id, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ctl.SetReadDeadline(dl)
	} else {
		_ = ctl.SetReadDeadline(time.Now().Add(time.Minute))
	}
	if !joined {
		// The init builds the root while it is moved into its cgroup.
		if err := s.waitJoined(); err != nil {
			return nil, fmt.Errorf("branch %s: %w", n.id, err)
		}
		if err := initReply(ctl, 'R'); err != nil {
			return nil, fmt.Errorf("branch %s: %w", n.id, err)
		}
		if _, err := ctl.Write([]byte{'G'}); err != nil {
			return nil, fmt.Errorf("branch %s: start its init: %w", n.id, err)
		}
	}
	if err := initReply(ctl, 'O'); err != nil {
		if ms, herr := c.hier(); herr == nil && cgroup.EAGAINText(err) {
			// Its fork of the command was refused: by a limit above it,
			// or by the branch's own.
			if pl := cgroup.AsPidsLimit([]error{err}, cgroup.PidsLimits(ms, n.cgroup), 0); pl != nil {
				return nil, pl
			}
		}
		return nil, fmt.Errorf("branch %s: %w", n.id, err)
	}
	_ = ctl.SetReadDeadline(time.Time{})
	fc := &fastCtx{init: s.init, ctl: ctl, cfg: plan.Cfg, byID: map[string]*fastProc{}, byPid: map[int]*fastProc{}}
	go fc.read(context.WithoutCancel(ctx))
	return fc, nil
}

// initReply reads the init's next word, which must be want (or say why
// not).
func initReply(ctl *net.UnixConn, want byte) error {
	buf := make([]byte, 2048)
	k, err := ctl.Read(buf)
	switch {
	case err != nil:
		return fmt.Errorf("its init ended before it was ready (%v): %w", err, errdefs.ErrUnknown)
	case k > 0 && buf[0] == 'F':
		return fmt.Errorf("set up: %s: %w", buf[1:k], errdefs.ErrFailedPrecondition)
	case k == 0 || buf[0] != want:
		return fmt.Errorf("unexpected reply from its init %q: %w", buf[:k], errdefs.ErrUnknown)
	}
	return nil
}

// read takes the init's reports: pids of started processes and exits.
func (fc *fastCtx) read(ctx context.Context) {
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
	fc.byPid = map[int]*fastProc{}
	waiting := fc.waiting
	fc.waiting = nil
	fc.mu.Unlock()
	for _, p := range waiting {
		p.startErr = "-1 the branch's init ended"
		close(p.startedCh)
	}
	for _, p := range left {
		p.SetExited(128 + int(unix.SIGKILL))
	}
}

func exitStatus(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// Pid is the init's pid on the host.
func (fc *fastCtx) Pid() int { return fc.init.Pid() }

// Process is an exec'd process, or the init for "".
func (fc *fastCtx) Process(id string) (process.Process, error) {
	if id == "" {
		return fc.init, nil
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	p, ok := fc.byID[id]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return p, nil
}

func (fc *fastCtx) remove(id string) {
	fc.mu.Lock()
	delete(fc.byID, id)
	fc.mu.Unlock()
}

func (fc *fastCtx) execd() []process.Process {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	var out []process.Process
	for _, p := range fc.byID {
		out = append(out, p)
	}
	return out
}

// close ends the control socket, which ends a waiting init.
func (fc *fastCtx) close() { fc.ctl.Close() }

// exec starts a process in the branch through its init.
func (fc *fastCtx) exec(ctx context.Context, id string, ps *specs.Process, stdin, stdout, stderr string) (_ process.Process, retErr error) {
	fc.mu.Lock()
	if _, dup := fc.byID[id]; dup {
		fc.mu.Unlock()
		return nil, fmt.Errorf("exec id %s: %w", id, errdefs.ErrAlreadyExists)
	}
	if fc.closed {
		fc.mu.Unlock()
		return nil, fmt.Errorf("the branch's init has ended: %w", errdefs.ErrFailedPrecondition)
	}
	p := newFastProc(id, fc)
	p.stdio = stdio.Stdio{Stdin: stdin, Stdout: stdout, Stderr: stderr, Terminal: ps.Terminal}
	fc.byID[id] = p
	fc.mu.Unlock()
	defer func() {
		if retErr != nil {
			fc.remove(id)
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
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	replyTheirs := os.NewFile(uintptr(sp[1]), "reply-child")
	defer replyTheirs.Close()
	if err := unix.SetsockoptInt(sp[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(sp[0])
		return nil, err
	}
	replyFile := os.NewFile(uintptr(sp[0]), "reply")
	rc, err := net.FileConn(replyFile)
	replyFile.Close()
	if err != nil {
		return nil, err
	}
	reply := rc.(*net.UnixConn)
	defer reply.Close()
	var rights []int
	for _, f := range files {
		rights = append(rights, int(f.Fd()))
	}
	rights = append(rights, int(replyTheirs.Fd()))
	msg := append([]byte{'E'}, w.Bytes()...)

	fc.sendMu.Lock()
	fc.mu.Lock()
	fc.waiting = append(fc.waiting, p)
	fc.mu.Unlock()
	_, _, err = fc.ctl.WriteMsgUnix(msg, unix.UnixRights(rights...), nil)
	if err != nil {
		fc.mu.Lock()
		for i, q := range fc.waiting {
			if q == p {
				fc.waiting = append(fc.waiting[:i], fc.waiting[i+1:]...)
				break
			}
		}
		fc.mu.Unlock()
		fc.sendMu.Unlock()
		return nil, fmt.Errorf("ask the branch's init to start %v: %w", ps.Args, err)
	}
	fc.sendMu.Unlock()
	for _, f := range files {
		f.Close()
	}
	files = nil
	replyTheirs.Close()
	select {
	case <-p.startedCh:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if strings.HasPrefix(p.startErr, "-1") {
		return nil, fmt.Errorf("start %v: %s: %w", ps.Args, strings.TrimSpace(strings.TrimPrefix(p.startErr, "-1")), errdefs.ErrUnknown)
	}
	// The process reports its host pid, its terminal, and an exec error
	// if there is one; the socket closes when it execs.
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
			return nil, fmt.Errorf("exec in branch: %s: %w", buf[1:k], errdefs.ErrNotFound)
		}
	}
	if p.Pid() <= 0 {
		_ = p.Wait(ctx)
		return nil, fmt.Errorf("start %v: the process ended before it ran: %w", ps.Args, errdefs.ErrUnknown)
	}
	if ps.Terminal {
		if p.console == nil {
			return nil, fmt.Errorf("start %v: no terminal came back: %w", ps.Args, errdefs.ErrUnknown)
		}
		if err := p.copyConsole(ctx); err != nil {
			return nil, err
		}
	}
	return p, nil
}
