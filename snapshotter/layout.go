//go:build linux

package snapshotter

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
)

// mounts are the mounts of a snapshot. With an id mapping its image layers
// are id-mapped (idmap_linux.go); a layer of its own (a bind of an active
// snapshot without parents) is not, as it holds host ids.
func (s *store) mounts(snap storage.Snapshot, idmap idMapping) []mount.Mount {
	if len(snap.ParentIDs) == 0 {
		// overlay needs at least one lower; a base layer is a bind mount.
		ro := "rw"
		if snap.Kind == snapshots.KindView {
			ro = "ro"
		}
		return []mount.Mount{{
			Type:    "bind",
			Source:  s.upperPath(snap.ID),
			Options: []string{ro, "rbind"},
		}}
	}
	var options []string
	if snap.Kind == snapshots.KindActive {
		options = append(options,
			"workdir="+s.workPath(snap.ID),
			"upperdir="+s.upperPath(snap.ID),
		)
	} else if len(snap.ParentIDs) == 1 {
		return []mount.Mount{{
			Type:    "bind",
			Source:  s.upperPath(snap.ParentIDs[0]),
			Options: append(idmap.options(), "ro", "rbind"),
		}}
	}
	lowers := make([]string, len(snap.ParentIDs))
	for i, id := range snap.ParentIDs {
		lowers[i] = s.upperPath(id)
	}
	options = append(options, "lowerdir="+strings.Join(lowers, ":"))
	options = append(options, idmap.options()...)
	options = append(options, s.options...)
	return []mount.Mount{{Type: "overlay", Source: "overlay", Options: options}}
}

func (s *store) upperPath(id string) string {
	return filepath.Join(s.root, "snapshots", id, "fs")
}

func (s *store) workPath(id string) string {
	return filepath.Join(s.root, "snapshots", id, "work")
}

// overlayOptions are options of every overlay mount the snapshotter
// makes, each where the kernel has it (its module parameter is there),
// so that a mount behaves the same whatever the node's defaults:
//   - index=off keeps overlay from refusing to remount an upper with a
//     different lower stack, which branches do routinely;
//   - redirect_dir=off and metacopy=off: where they are on by default
//     (kernels built with CONFIG_OVERLAY_FS_REDIRECT_DIR, as Ubuntu's
//     are, or CONFIG_OVERLAY_FS_METACOPY, which turns on both), a
//     directory of a lower layer renamed in a branch, or a lower file
//     whose owner or mode changed, is recorded in the upper as an xattr
//     naming the lower one, which a commit's apply, a checkpoint's diff
//     and a pushed layer cannot carry: the branch's commit was refused as
//     not implemented. Off, such a rename fails with EXDEV and tools
//     (mv, rename in Python, git) copy instead, as on other nodes;
//     buildkit turns redirect_dir off for the same reason.
func overlayOptions() []string {
	var options []string
	for _, o := range []string{"index=off", "redirect_dir=off", "metacopy=off"} {
		param, _, _ := strings.Cut(o, "=")
		if _, err := os.Stat("/sys/module/overlay/parameters/" + param); err == nil {
			options = append(options, o)
		}
	}
	return options
}
