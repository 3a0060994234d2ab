//go:build linux

package shim

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"strconv"
	"time"

	"github.com/containerd/log"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// An init started ahead of a fork of the sandbox's root can do part of a
// branch's root before the fork: what does not depend on the branch's
// rootfs or cgroup. splitPrep divides a plan so: the early part joins the
// sandbox's namespaces (setns) and makes the new filesystems of the
// root's mounts (proc, sysfs, /dev's tmpfs, devpts, mqueue, ...) as
// detached mounts held in numbered slots (fsopen, fsmount), with /dev's
// device nodes and links made in its tmpfs; the late part, sent at the
// fork, attaches each slot where the mount was (move_mount), in the
// plan's order, and does the rest as before. The filesystems, nodes and
// links are the same: only their making moves out of the fork.

// prepFSTypes are the filesystems a slot may hold: ones a mount makes
// afresh, whose options are the same whoever mounts them. sysfs is made
// in the network namespace the init joined first, as a mount at the fork
// would be.
var prepFSTypes = map[string]bool{"proc": true, "sysfs": true, "tmpfs": true, "devpts": true, "mqueue": true}

// prepMountFlags are the mount(2) flags a detached mount takes as
// attributes (fsmount); a mount with others is left to the fork.
const prepMountFlags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC |
	unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME | unix.MS_STRICTATIME

// splitPrep divides a plan's ops into those an init started ahead runs
// at once and those it runs at the fork. ok is false if there is nothing
// to gain (no op moves).
func splitPrep(ops [][]string) (early, late cfgWriter, ok bool) {
	slots := map[string]string{} // mount destination -> slot
	mounted := map[string]int{}  // how often the plan mounts on a path
	for _, o := range ops {
		if o[0] == "mount" || o[0] == "bind" {
			mounted[path.Clean(o[2])]++
		}
	}
	rooted := false
	for _, o := range ops {
		switch o[0] {
		case "setns":
			if !rooted {
				early.op(o[0], o[1:]...)
				continue
			}
		case "root":
			rooted = true
		case "mount":
			// mount SRC DST FSTYPE FLAGS DATA
			flags, err := strconv.Atoi(o[4])
			if rooted && err == nil && prepFSTypes[o[3]] && flags&^prepMountFlags == 0 && path.Clean(o[2]) != "/" {
				slot := strconv.Itoa(len(slots))
				slots[path.Clean(o[2])] = slot
				early.op("fsmount", slot, o[1], o[3], o[4], o[5])
				late.op("attach", slot, o[2])
				continue
			}
		case "mknod", "symlink":
			// mknod DST MODE MAJOR MINOR UID GID; symlink TARGET DST:
			// straight into a slot's filesystem if DST is a name in its
			// root that no mount covers.
			dst := o[1]
			if o[0] == "symlink" {
				dst = o[2]
			}
			dst = path.Clean(dst)
			dir := path.Dir(dst)
			if slot, ok := slots[dir]; ok && mounted[dir] == 1 && mounted[dst] == 0 {
				if o[0] == "mknod" {
					early.op("mknodat", append([]string{slot, path.Base(dst)}, o[2:]...)...)
				} else {
					early.op("symlinkat", slot, o[1], path.Base(dst))
				}
				continue
			}
		}
		late.op(o[0], o[1:]...)
	}
	return early, late, len(early.ops) > 0
}

// prepOf is the early part of the plan of a branch with spec, for the
// inits started ahead of forks like it; nil if none.
func prepOf(ctx context.Context, spec *specs.Spec) []byte {
	// The rootfs, cgroup and seccomp program are the late part's.
	plan, err := planFast(spec, "/", map[string]string{}, nil)
	if err != nil {
		log.G(ctx).WithError(err).Debug("plan the early part of a branch's root")
		return nil
	}
	early, _, ok := splitPrep(plan.conf.ops)
	if !ok {
		return nil
	}
	return bytes.Clone(early.Bytes())
}

// prep sends a spawned init the early part of a plan and waits for it to
// be done.
func (s *spawned) prep(early []byte) error {
	msg := append([]byte{'P'}, early...)
	if _, err := s.ctl.Write(msg); err != nil {
		return fmt.Errorf("send the branch init its early set-up: %w", err)
	}
	_ = s.ctl.SetReadDeadline(time.Now().Add(time.Minute))
	defer func() { _ = s.ctl.SetReadDeadline(time.Time{}) }()
	if err := initReply(s.ctl, 'p'); err != nil {
		return fmt.Errorf("early set-up: %w", err)
	}
	s.prepped = bytes.Clone(early)
	return nil
}
