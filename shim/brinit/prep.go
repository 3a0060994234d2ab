//go:build linux

package brinit

import (
	"path"
	"strconv"

	"golang.org/x/sys/unix"
)

// An init started ahead of a fork of the sandbox's root can do part of a
// branch's root before the fork: what does not depend on the branch's
// rootfs or cgroup. SplitPrep divides a plan so: the early part joins the
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

// SplitPrep divides a plan's ops into those an init started ahead runs
// at once and those it runs at the fork. ok is false if there is nothing
// to gain (no op moves).
func SplitPrep(ops [][]string) (early, late Config, ok bool) {
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
				early.Op(o[0], o[1:]...)
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
				early.Op("fsmount", slot, o[1], o[3], o[4], o[5])
				late.Op("attach", slot, o[2])
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
					early.Op("mknodat", append([]string{slot, path.Base(dst)}, o[2:]...)...)
				} else {
					early.Op("symlinkat", slot, o[1], path.Base(dst))
				}
				continue
			}
		}
		late.Op(o[0], o[1:]...)
	}
	return early, late, len(early.ops) > 0
}
