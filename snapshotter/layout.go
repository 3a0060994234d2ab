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

func hasOption(options []string, key string) bool {
	for _, o := range options {
		if o == key || strings.HasPrefix(o, key+"=") {
			return true
		}
	}
	return false
}

func supportsIndex() bool {
	_, err := os.Stat("/sys/module/overlay/parameters/index")
	return err == nil
}
