//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// A snapshot prepared with the id-mapping labels (a pod with its own user
// namespace: containerd's CRI sets them when the proxy plugin declares the
// "remap-ids" capability) is mounted as containerd's overlayfs mounts one:
// its image layers, which hold the image's own ids, are id-mapped into the
// user namespace's host range, and its upper holds host ids (what the
// container's processes write, seen from the host).
//
// For the root's own mount the "uidmap=" and "gidmap=" options do it:
// containerd's mount code id-maps every lowerdir. A branch's lowers are
// its ancestors' uppers (host ids already, not to be mapped again) over
// the image layers, so its mount cannot use those options; it names the
// image layers through the root's id-mapped view instead, a read-only
// id-mapped bind of <root>/snapshots at
//
//	<root>/branches/<root snapshot id>/idmap
//
// made when the root's branches are first mounted, and detached with the
// root's branch directory (its removal, or the reaper's). Overlayfs keeps
// its own private clone of each layer's mount, so the branches' mounts do
// not depend on the view staying mounted.

// idmapViewName is the view's entry in a root's branch directory; branch
// ids are numbers, so it names no branch.
const idmapViewName = "idmap"

// idMapping is the id mapping a snapshot's labels ask for, in the labels'
// form ("containerID:hostID:size[,...]"); empty when none was asked for.
type idMapping struct{ uid, gid string }

// idMappingOf is the id mapping snap's mounts apply: its labels', unless
// its image was remapped already. A containerd whose configuration does not
// declare this snapshotter's "remap-ids" capability copies the image into
// a snapshot of its own and chowns every file to the mapped ids (its root
// directory too), then prepares the container's snapshot on that copy with
// the same labels: mapping it again would give every file the overflow id.
func (s *store) idMappingOf(snap storage.Snapshot, labels map[string]string) idMapping {
	m := idMapping{uid: labels[snapshots.LabelSnapshotUIDMapping], gid: labels[snapshots.LabelSnapshotGIDMapping]}
	if !m.mapped() || len(snap.ParentIDs) == 0 {
		return m
	}
	uid, gid, _, err := mappedRoot(labels)
	if err != nil {
		return m
	}
	var st unix.Stat_t
	if err := unix.Lstat(s.upperPath(snap.ParentIDs[0]), &st); err == nil && uid != 0 && int(st.Uid) == uid && int(st.Gid) == gid {
		return idMapping{}
	}
	return m
}

func (m idMapping) mapped() bool { return m.uid != "" && m.gid != "" }

// options are the mount options containerd's mount code id-maps lowers by.
func (m idMapping) options() []string {
	if !m.mapped() {
		return nil
	}
	return []string{"uidmap=" + m.uid, "gidmap=" + m.gid}
}

func (s *store) idmapView(rootID string) string {
	return s.branchDir(rootID, idmapViewName)
}

// imageLayer is where a branch of r reads the image layer id: through the
// root's id-mapped view when r is id-mapped.
func (s *store) imageLayer(r rootSnap, id string) string {
	if !r.idmap.mapped() {
		return s.upperPath(id)
	}
	return filepath.Join(s.idmapView(r.id()), id, "fs")
}

// ensureIDMapView mounts the id-mapped view of r's image layers if r is
// id-mapped and the view is not mounted (first branch, or after a reboot).
func (s *store) ensureIDMapView(ctx context.Context, r rootSnap) error {
	if !r.idmap.mapped() || len(r.snap.ParentIDs) == 0 {
		return nil
	}
	// Callers that only read a tree (mounts of a branch or a checkpoint)
	// do not hold the root's lock: two must not both mount the view.
	s.idmapMu.Lock()
	defer s.idmapMu.Unlock()
	view := s.idmapView(r.id())
	if mounted, err := mountinfo.Mounted(view); err == nil && mounted {
		return nil
	}
	if err := os.MkdirAll(view, 0o700); err != nil {
		return fmt.Errorf("make the id-mapped view of %s's image layers: %w", r.key, err)
	}
	userns, err := mount.GetUsernsFD(r.idmap.uid, r.idmap.gid)
	if err != nil {
		return fmt.Errorf("id mapping %s / %s of %s: %v: %w", r.idmap.uid, r.idmap.gid, r.key, err, errdefs.ErrInvalidArgument)
	}
	defer userns.Close()
	// Read-only: nothing writes an image layer through it, and a removal
	// that missed the detach could not reach the layers through it.
	err = mount.IDMapMountWithAttrs(filepath.Join(s.root, "snapshots"), view, int(userns.Fd()), unix.MOUNT_ATTR_RDONLY, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("id-map the image layers of %s (the filesystem of %s must support id-mapped mounts): %w: %w", r.key, s.root, err, errdefs.ErrNotImplemented)
		}
		return fmt.Errorf("id-map the image layers of %s: %w", r.key, err)
	}
	log.G(ctx).WithFields(log.Fields{"root": r.key, "view": view, "uidmap": r.idmap.uid, "gidmap": r.idmap.gid}).Debug("mounted the id-mapped view of the image layers")
	return nil
}
