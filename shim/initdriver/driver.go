//go:build linux

package initdriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/shim/cgroup"
)

// The branch init's driver: an init spawned in its cgroups, configured over
// its socket, and the processes it starts and reports.

// Driver starts branch inits in their cgroups and drives them.
type Driver struct {
	// Binary is the branch init, "" if it is not installed: every branch
	// then runs on the runtime.
	Binary string
	// Cgroups is the host's cgroup hierarchies and its clone lock.
	Cgroups *cgroup.Host
	// Watch routes a process's exit, from the shim's one reaper, to it;
	// started is when it was started.
	Watch func(p process.Process, started time.Time)
	// SharedRoot: the node's root mount is shared (systemd as PID 1), and
	// an init started ahead makes its mount namespace when it is prepared
	// (brinit.c, own_mntns), not at the fork. See RootShared.
	SharedRoot bool
}

// RootShared says whether this process's root mount (the last mounted on
// "/") propagates: an optional field "shared:N" in its mountinfo.
func RootShared() bool {
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter("/"))
	if err != nil || len(infos) == 0 {
		return false
	}
	return strings.Contains(infos[len(infos)-1].Optional, "shared:")
}

// Config is what the driver needs of a branch to start it.
type Config struct {
	ID         string
	Spec       *specs.Spec
	Cgroup     string         // its cgroup path
	Limits     *shimv1.Limits // given at fork
	HasCommand bool           // its spec's process runs, rather than the init waiting
	// Path is the sandbox's way of starting its branches, with its
	// seccomp profile compiled once.
	Path *Path
}

// Spawned is a branch init started in new namespaces and being moved into
// its cgroup, waiting for its instructions.
type Spawned struct {
	init   *Process
	ctl    *net.UnixConn
	cgroup string            // its cgroup path
	paths  map[string]string // its cgroup's directories, by controller
	Flags  uintptr           // the namespaces it was cloned with
	joined chan error        // the move into the cgroup, once done
	// prepped is the early part of a plan it ran (splitPrep), or nil.
	prepped []byte
}

// waitJoined waits for the init's move into its cgroup and says how it
// went; the answer stays for later callers.
func (s *Spawned) waitJoined() error {
	err := <-s.joined
	s.joined <- err
	return err
}

// ended says whether the init has exited (killed while it waited, say by
// the sandbox's OOM killer).
func (s *Spawned) ended() bool {
	select {
	case <-s.init.exited:
		return true
	default:
		return false
	}
}

// Discard kills an init that will not be a branch's and removes its
// cgroup.
func (s *Spawned) Discard(ctx context.Context) {
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
func (s *Spawned) rename(to string) error {
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
