//go:build linux

package initdriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/cgroups"
	cgmanager "github.com/opencontainers/cgroups/manager"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/branchbox/branchbox/shim/cmdlog"
)

// A branch's init started, in one call from the sandbox: taken from the
// pool or spawned in its cgroup while the branch's rootfs is mounted, then
// configured. Here, with the steps it takes, so that a fork's path through
// the init driver is one file.

// From is where a branch's init may come from before one is spawned: an
// init taken ahead for it, or the sandbox's pool (nil: neither).
type From struct {
	Ahead *Ahead
	Pool  *Pool
}

// StartBranch starts branch b's init: one taken ahead or from the pool if
// it fits, or one spawned, while mount mounts its rootfs at rootfs; then
// has it build the branch's root and start its command. If the init
// fails, the rootfs is unmounted again; a failed mount's error is
// returned as mount gave it.
func (d *Driver) StartBranch(ctx context.Context, b Config, from From, rootfs, cmdLog string, mountRootfs func() error) (*Branch, error) {
	type spawnResult struct {
		s   *Spawned
		err error
	}
	spawnDone := make(chan spawnResult, 1)
	go func() {
		flags := brinit.CloneFlags(b.Spec)
		if from.Ahead != nil {
			if s := from.Ahead.Claim(ctx, b.Cgroup); s != nil {
				if s.Flags == flags {
					spawnDone <- spawnResult{s: s}
					return
				}
				s.Discard(ctx)
			}
		} else if from.Pool != nil {
			if s := from.Pool.Take(ctx, flags, b.Cgroup); s != nil {
				spawnDone <- spawnResult{s: s}
				return
			}
		}
		s, err := d.Spawn(ctx, b.Cgroup, flags)
		spawnDone <- spawnResult{s, err}
	}()
	err := mountRootfs()
	sr := <-spawnDone
	if err != nil || sr.err != nil {
		if sr.s != nil {
			sr.s.Discard(ctx)
		}
		if err == nil {
			_ = unix.Unmount(rootfs, unix.MNT_DETACH)
			err = fmt.Errorf("branch %s: %w", b.ID, sr.err)
		}
		return nil, err
	}
	fc, err := d.Configure(ctx, b, sr.s, rootfs, cmdLog)
	if err != nil {
		if uerr := mount.UnmountRecursive(rootfs, unix.MNT_DETACH); uerr != nil {
			log.G(ctx).WithError(uerr).WithField("branch", b.ID).Warn("unmount rootfs of a failed branch")
		}
		return nil, err
	}
	return fc, nil
}

// Take returns a started init for a branch cloned with flags, in its
// cgroup and with that cgroup renamed to cgroup; or nil, and the branch
// starts one of its own.
func (p *Pool) Take(ctx context.Context, flags uintptr, cgroup string) *Spawned {
	if s := p.takeNamed(ctx, cgroup); s != nil {
		if s.Flags == flags {
			return s
		}
		s.Discard(ctx) // its name is the branch's
	}
	if s := p.takeOut(flags); s != nil {
		return p.moveAway(ctx, s, cgroup)
	}
	return nil
}

// Claim returns the init for the branch whose cgroup is cgroup (the
// guess: Fork drops every init taken ahead if one guess is wrong), renamed
// again if its guess was not cgroup; nil if it cannot be used, and it is
// discarded.
func (a *Ahead) Claim(ctx context.Context, cgroup string) *Spawned {
	a.claimed = true
	s := <-a.renamed
	if s == nil || a.Guess == cgroup {
		return s
	}
	return s.renamedOrDiscarded(ctx, cgroup)
}

// Spawn makes a cgroup and starts an init in new namespaces (flags),
// inside the cgroup's pids and memory cgroups (startIn), so that the
// process limits above it hold from its first instant. On the other v1
// hierarchies it is moved in the background while it can already build
// a root; a fork refused by a process limit is a *PidsLimit.
func (d *Driver) Spawn(ctx context.Context, cgroupPath string, flags uintptr) (*Spawned, error) {
	return d.spawn(ctx, cgroupPath, flags, false)
}

// errCgroupExists: an init to be spawned in a cgroup of its own found it
// made already.
var errCgroupExists = errors.New("cgroup exists")

// spawn is Spawn; exclusive, it fails with errCgroupExists rather than
// start the init in a cgroup that exists (a branch's, or another init's).
func (d *Driver) spawn(ctx context.Context, cgroupPath string, flags uintptr, exclusive bool) (_ *Spawned, retErr error) {
	cgm, err := makeCgroup(ctx, cgroupPath, exclusive)
	if err != nil {
		return nil, err
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
	pid, born, err := d.Cgroups.StartIn(ctx, cgroupPath, paths, d.Binary, []string{"brinit"}, &syscall.ProcAttr{
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
	init := newProcess("", nil)
	init.pid, init.pidfd = pid, pidfd
	d.Watch(init, started)
	s := &Spawned{init: init, ctl: ctl, cgroup: cgroupPath, paths: paths, Flags: flags, joined: make(chan error, 1)}
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

// Configure has a spawned init build a branch's root and start its
// command; it returns once the branch is ready or the init said why not.
func (d *Driver) Configure(ctx context.Context, b Config, s *Spawned, rootfs string, cmdLog string) (_ *Branch, retErr error) {
	defer func() {
		if retErr != nil {
			s.Discard(ctx)
		}
	}()
	plan, prog, err := d.plan(ctx, b, s, rootfs)
	if err != nil {
		return nil, err
	}
	conf, fds, closeFds, err := setUp(ctx, b, s, plan, prog, rootfs, cmdLog)
	if err != nil {
		return nil, err
	}
	defer closeFds()
	oob := unix.UnixRights(fds...)
	ctl := s.ctl
	// An init in its cgroups already (one started ahead) goes on from its
	// root to the command without waiting for a word: one round trip
	// less.
	joined, err := s.joinedYet()
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", b.ID, err)
	}
	if joined {
		conf.Op("joined")
	}
	msg := append([]byte{'C'}, conf.Bytes()...)
	if _, _, err := ctl.WriteMsgUnix(msg, oob, nil); err != nil {
		return nil, fmt.Errorf("branch %s: send its init the branch's set-up: %w", b.ID, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ctl.SetReadDeadline(dl)
	} else {
		_ = ctl.SetReadDeadline(time.Now().Add(time.Minute))
	}
	if err := d.awaitReady(b, s, joined); err != nil {
		return nil, err
	}
	_ = ctl.SetReadDeadline(time.Time{})
	fc := &Branch{initProc: s.init, ctl: ctl, cfg: plan.Cfg, byID: map[string]*Process{}, byPid: map[int]*Process{}}
	go fc.read(context.WithoutCancel(ctx))
	return fc, nil
}

// plan sets a branch's limits on its cgroup and plans its init's work,
// with the sandbox's seccomp program (nil: none).
func (d *Driver) plan(ctx context.Context, b Config, s *Spawned, rootfs string) (*brinit.Plan, *Seccomp, error) {
	if err := cgroup.SetLimits(s.paths, b.Limits); err != nil {
		return nil, nil, fmt.Errorf("branch %s: set limits: %w", b.ID, err)
	}
	var prog *Seccomp
	if b.Spec.Linux.Seccomp != nil {
		// Compiled when the sandbox chose the init (useInit).
		var err error
		if prog, err = b.Path.Seccomp(ctx, b.Spec.Linux.Seccomp); err != nil {
			return nil, nil, fmt.Errorf("branch %s: %w", b.ID, err)
		}
	}
	var sc *brinit.Seccomp
	if prog != nil {
		sc = &prog.Seccomp
	}
	plan, err := brinit.NewPlan(b.Spec, rootfs, s.paths, sc)
	if err != nil {
		return nil, nil, fmt.Errorf("branch %s: %w", b.ID, err)
	}
	if plan.Clone != s.Flags {
		return nil, nil, fmt.Errorf("branch %s: its init was started with namespaces %#x, the spec wants %#x: %w", b.ID, s.Flags, plan.Clone, errdefs.ErrInternal)
	}
	return plan, prog, nil
}

// setUp is the set-up a spawned init is sent: the config (the part of the
// plan it has not made yet) and the descriptors it takes, which
// closeFds closes once they are sent.
func setUp(ctx context.Context, b Config, s *Spawned, plan *brinit.Plan, prog *Seccomp, rootfs, cmdLog string) (_ *brinit.Config, fds []int, closeFds func(), retErr error) {
	var closers []func()
	closeFds = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if retErr != nil {
			closeFds()
		}
	}()
	// The init attaches a clone of the shim's rootfs mount: it may have
	// been started (its mount namespace copied) before the rootfs was
	// mounted.
	rootMnt, err := unix.OpenTree(unix.AT_FDCWD, rootfs, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("branch %s: clone its rootfs mount: %w", b.ID, err)
	}
	closers = append(closers, func() { unix.Close(rootMnt) })
	fds = []int{rootMnt}
	conf := &plan.Conf
	if s.prepped != nil {
		// An init started ahead did the early part already: if it is
		// this plan's (it is, unless the sandbox's namespaces moved), it
		// gets the rest; otherwise all of it, and drops what it made.
		if early, late, ok := brinit.SplitPrep(plan.Conf.Ops()); ok && bytes.Equal(early.Bytes(), s.prepped) {
			conf = &late
			log.G(ctx).WithField("branch", b.ID).Debug("the branch's init, started ahead, made the early part of its root")
		}
	}
	if b.HasCommand {
		if err := brinit.WriteProc(conf, b.Spec.Process, plan.Cfg, false); err != nil {
			return nil, nil, nil, err
		}
		conf.Op("run")
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, nil, nil, err
		}
		closers = append(closers, func() { null.Close() })
		// The command writes to a pipe that its init copies into the
		// log, bounded, at the branch's cost (brinit.c, op log): a file
		// it wrote to itself would grow without end.
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return nil, nil, nil, fmt.Errorf("branch %s: command output pipe: %w", b.ID, err)
		}
		closers = append(closers, func() { unix.Close(p[0]); unix.Close(p[1]) })
		out, err := os.OpenFile(cmdLog, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("branch %s: command log: %w", b.ID, err)
		}
		closers = append(closers, func() { out.Close() })
		conf.Op("log", strconv.Itoa(cmdlog.MaxSize))
		// stdin, stdout, stderr; then the log's (ops take their
		// descriptors from the end: the seccomp program's, then these).
		fds = append(fds, int(null.Fd()), p[1], p[1], p[0], int(out.Fd()))
	}
	if prog != nil {
		fds = append(fds, int(prog.file.Fd())) // last: the seccomp op (brinit.NewPlan)
	}
	return conf, fds, closeFds, nil
}

// awaitReady waits for a configured init to say its branch is ready: an
// init not yet in its cgroups builds the root while it is moved there,
// and is told to go on once it is.
func (d *Driver) awaitReady(b Config, s *Spawned, joined bool) error {
	ctl := s.ctl
	if !joined {
		if err := s.waitJoined(); err != nil {
			if errors.Is(err, unix.ESRCH) {
				// The init ended before its move: if its set-up failed,
				// it said why before it ended, and that is the error.
				_ = ctl.SetReadDeadline(time.Now().Add(time.Second))
				if rerr := initReply(ctl, 'R'); errors.Is(rerr, errdefs.ErrFailedPrecondition) {
					return fmt.Errorf("branch %s: %w", b.ID, rerr)
				}
			}
			return fmt.Errorf("branch %s: %w", b.ID, err)
		}
		if err := initReply(ctl, 'R'); err != nil {
			return fmt.Errorf("branch %s: %w", b.ID, err)
		}
		if _, err := ctl.Write([]byte{'G'}); err != nil {
			return fmt.Errorf("branch %s: start its init: %w", b.ID, err)
		}
	}
	if err := initReply(ctl, 'O'); err != nil {
		if ms, herr := d.Cgroups.Mounts(); herr == nil && cgroup.EAGAINText(err) {
			// Its fork of the command was refused: by a limit above it,
			// or by the branch's own.
			if pl := cgroup.AsPidsLimit([]error{err}, cgroup.PidsLimits(ms, b.Cgroup), 0); pl != nil {
				return pl
			}
		}
		return fmt.Errorf("branch %s: %w", b.ID, err)
	}
	return nil
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

// joinedYet says, without waiting, whether the init's move into its
// cgroup is done, and how it went.
func (s *Spawned) joinedYet() (bool, error) {
	select {
	case err := <-s.joined:
		s.joined <- err
		return true, err
	default:
		return false, nil
	}
}

// makeCgroup makes the cgroup of an init to be spawned, on every
// hierarchy; exclusive, errCgroupExists if it exists.
func makeCgroup(ctx context.Context, cgroupPath string, exclusive bool) (cgroups.Manager, error) {
	// Also done by the fork; the pool starts inits between forks.
	if err := cgroup.PrepareBranchParent(ctx, filepath.Dir(cgroupPath)); err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	cgm, err := cgmanager.New(&cgroups.Cgroup{Path: cgroupPath, Resources: &cgroups.Resources{}})
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	if dir := firstDir(cgm.GetPaths()); exclusive && dir != "" {
		// One hierarchy's mkdir decides; Apply makes the others.
		if err := os.Mkdir(dir, 0o755); err != nil {
			if errors.Is(err, os.ErrExist) {
				return nil, errCgroupExists
			}
			return nil, fmt.Errorf("make cgroup %s: %w", cgroupPath, err)
		}
	}
	// The new cgroup (devices included) starts with what its parent
	// allows, and its parent's limits bound it.
	if err := cgm.Apply(-1); err != nil {
		if exclusive {
			_ = cgm.Destroy() // what it made, the first directory included
		}
		return nil, fmt.Errorf("make cgroup %s: %w", cgroupPath, err)
	}
	return cgm, nil
}

// firstDir is the directory of paths (a cgroup's, by controller) that an
// exclusive spawn makes first: the unified hierarchy's, else the first.
func firstDir(paths map[string]string) string {
	if d, ok := paths[""]; ok || len(paths) == 0 {
		return d
	}
	return paths[slices.Min(slices.Collect(maps.Keys(paths)))]
}
