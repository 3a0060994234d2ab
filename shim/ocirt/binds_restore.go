//go:build linux

package ocirt

// A restore into a user namespace: CRIU binds each external mount of the
// image from inside the user namespace it makes, as its root (a host uid of
// the mapped range), which must be able to search every directory on the
// way to the mount's source. A container's bind mounts often come from
// directories only the host's root may search (nerdctl's /etc/resolv.conf,
// /etc/hosts and /etc/hostname, in its 0700 data root; a volume below a
// 0700 directory): the container itself got them because the runtime opened
// their sources as the host's root. So each bind source is first bound, as
// the host's root, below the restore's work directory, which the mapped
// root can search, and the restore names that bind instead; the runtime
// detaches it once the restore is done (the container's mount is CRIU's
// own clone of it). Only a source out of reach is: where the node's mounts
// are shared, CRIU's mount engine makes a restored bind a slave as the
// container's was by copying the sharing of one source of the group to all
// its binds, and only the original sources' mounts are wide enough for
// that. A restore with such a rebound source, shared, is made with CRIU's
// older mount engine (mntns-compat-mode), which makes binds slaves of their
// own sources.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// reachableBinds rebinds below work the bind sources of spec's mounts that
// the root of spec's user namespace cannot reach, for a restore into that
// namespace, and points the mounts at them (and CRIU at its older mount
// engine if one of them is shared); undo detaches and removes them.
// Nothing happens outside a user namespace.
func reachableBinds(work string, spec *specs.Spec) (undo func(), err error) {
	undo = func() {}
	if !inUserNS(spec) {
		return undo, nil
	}
	uid, gid, mapped := mappedRoot(spec)
	var binds []int
	for i, m := range spec.Mounts {
		// An id-mapped bind is libcontainer's to make from the host.
		if isBind(m) && filepath.IsAbs(m.Source) && len(m.UIDMappings) == 0 && !(mapped && searchable(m.Source, uid, gid)) {
			binds = append(binds, i)
		}
	}
	if len(binds) == 0 {
		return undo, nil
	}
	dir, err := searchableDir(work, "binds-")
	if err != nil {
		return undo, err
	}
	var targets []string
	undo = func() {
		for _, t := range targets {
			if err := unix.Unmount(t, unix.MNT_DETACH); err == nil || err == unix.EINVAL {
				_ = os.Remove(t)
			}
		}
		_ = os.Remove(filepath.Join(dir, "criu.conf"))
		_ = os.Remove(dir)
	}
	for _, i := range binds {
		m := &spec.Mounts[i]
		target := filepath.Join(dir, strconv.Itoa(i))
		if err := bindTarget(m.Source, target); err != nil {
			undo()
			return func() {}, fmt.Errorf("bind mount %s: %w", m.Destination, err)
		}
		targets = append(targets, target)
		flags := uintptr(unix.MS_BIND)
		if slices.Contains(m.Options, "rbind") {
			flags |= unix.MS_REC
		}
		// Left a peer of the source where the source is shared (a systemd
		// host's mounts): the container's mount was a slave of it, and
		// CRIU makes the restored one a slave of this one.
		if err := unix.Mount(m.Source, target, "", flags, ""); err != nil {
			undo()
			return func() {}, fmt.Errorf("bind mount %s: bind %s for the restore: %w", m.Destination, m.Source, err)
		}
		m.Source = target
	}
	if anyShared(dir) {
		if err := writeCriuConfig(dir, append(criuConfigOf(spec), "mntns-compat-mode"), spec); err != nil {
			undo()
			return func() {}, err
		}
	}
	return undo, nil
}

// anyShared says whether a mount below dir is shared (one read of the
// mount table for all of them).
func anyShared(dir string) bool {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(ms, func(m *mountinfo.Info) bool { return strings.Contains(m.Optional, "shared:") })
}

// mappedRoot is the host uid and gid of the root of spec's user namespace.
func mappedRoot(spec *specs.Spec) (uid, gid uint32, ok bool) {
	var uok, gok bool
	for _, m := range spec.Linux.UIDMappings {
		if m.ContainerID == 0 && m.Size > 0 {
			uid, uok = m.HostID, true
		}
	}
	for _, m := range spec.Linux.GIDMappings {
		if m.ContainerID == 0 && m.Size > 0 {
			gid, gok = m.HostID, true
		}
	}
	return uid, gid, uok && gok
}

// searchable says whether uid and gid (and no other group) may search every
// directory above path.
func searchable(path string, uid, gid uint32) bool {
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		var st unix.Stat_t
		if unix.Stat(dir, &st) != nil {
			return false
		}
		var bit uint32 = unix.S_IXOTH
		switch {
		case st.Uid == uid:
			bit = unix.S_IXUSR
		case st.Gid == gid:
			bit = unix.S_IXGRP
		}
		if st.Mode&bit == 0 {
			return false
		}
		if dir == "/" {
			return true
		}
	}
}

// isBind says whether a spec mount is a bind mount.
func isBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// bindTarget makes at target what a bind of source needs there: a
// directory for a directory, an empty file for anything else.
func bindTarget(source, target string) error {
	fi, err := os.Stat(source)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return os.Mkdir(target, 0o700)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// resolveBindSources points each bind mount of spec whose source is a
// symlink (nerdctl -v /lib64:/lib64, where /lib64 links to usr/lib64) at
// what it links to. The container's mount followed the link, as mount(2)
// does; CRIU's restore moves the source's tree with move_mount, which does
// not follow a final symlink ("Failed to move_mount from /lib64 ...:
// Invalid argument"), and libcontainer hands it the spec's source.
func resolveBindSources(spec *specs.Spec) error {
	for i, m := range spec.Mounts {
		if !isBind(m) || !filepath.IsAbs(m.Source) {
			continue
		}
		fi, err := os.Lstat(m.Source)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			continue // gone: the restore says so
		}
		real, err := filepath.EvalSymlinks(m.Source)
		if err != nil {
			return fmt.Errorf("bind mount of %s at %s: %w", m.Source, m.Destination, err)
		}
		spec.Mounts[i].Source = real
	}
	return nil
}
