//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// createSnapshot makes an active or view snapshot (op prepare or view) on
// a committed parent: its directory made under a temporary name, recorded,
// then renamed into place, all inside the metadata's transaction; a failure
// removes the directory.
func (s *Snapshotter) createSnapshot(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) (_ []mount.Mount, retErr error) {
	op := "prepare"
	if kind == snapshots.KindView {
		op = "view"
	}
	if err := validateCreate(op, key, parent, opts); err != nil {
		return nil, err
	}

	var (
		snap      storage.Snapshot
		idmap     idMapping
		tmp, path string
	)
	defer func() {
		if retErr == nil {
			return
		}
		for _, dir := range []string{tmp, path} {
			if dir == "" {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				log.G(ctx).WithError(err).WithField("path", dir).Error("failed to remove directory of a failed create; Cleanup will retry")
			}
		}
	}()

	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) (err error) {
		if err := checkParent(ctx, parent); err != nil {
			return err
		}

		snapshotsDir := filepath.Join(s.root, "snapshots")
		tmp, err = prepareDirectory(snapshotsDir, kind)
		if err != nil {
			return err
		}
		snap, err = storage.CreateSnapshot(ctx, kind, key, parent, opts...)
		if err != nil {
			if errdefs.IsAlreadyExists(err) {
				return fmt.Errorf("a snapshot with key %q already exists: %w", key, errdefs.ErrAlreadyExists)
			}
			return err
		}
		_, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		if err := s.chownUpper(filepath.Join(tmp, "fs"), snap, info); err != nil {
			return err
		}
		idmap = s.idMappingOf(snap, info.Labels)
		path = filepath.Join(snapshotsDir, snap.ID)
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("rename snapshot directory into place: %w", err)
		}
		tmp = ""
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", op, key, err)
	}
	return s.mounts(snap, idmap), nil
}

// validateCreate checks a create's keys and options.
func validateCreate(op, key, parent string, opts []snapshots.Opt) error {
	if err := validateKey(op, key); err != nil {
		return err
	}
	if parent != "" {
		if err := validateKey(op, parent); err != nil {
			return err
		}
	}
	return validateOpts(op, opts)
}

// checkParent checks, inside the create's transaction, that parent, if
// any, exists and is committed.
func checkParent(ctx context.Context, parent string) error {
	if parent == "" {
		return nil
	}
	_, pinfo, _, err := storage.GetInfo(ctx, parent)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("parent %q does not exist: %w", parent, errdefs.ErrNotFound)
		}
		return err
	}
	if pinfo.Kind != snapshots.KindCommitted {
		return fmt.Errorf("parent %q is %s snapshot; only committed snapshots can be parents (commit it first): %w", parent, kindName(pinfo.Kind), errdefs.ErrInvalidArgument)
	}
	return nil
}

// chownUpper gives a new upper directory the owner of the tree it covers:
// the root of the id mapping labels ask for, or the owner of the parent's
// top layer, so the merged root keeps its owner.
func (s *Snapshotter) chownUpper(dir string, snap storage.Snapshot, info snapshots.Info) error {
	uid, gid, mapped, err := mappedRoot(info.Labels)
	if err != nil {
		return err
	}
	if !mapped {
		if len(snap.ParentIDs) == 0 {
			return nil
		}
		st, err := os.Stat(s.upperPath(snap.ParentIDs[0]))
		if err != nil {
			return fmt.Errorf("stat parent layer: %w", err)
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat parent layer: unexpected stat type %T", st.Sys())
		}
		uid, gid = int(sys.Uid), int(sys.Gid)
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return fmt.Errorf("chown new layer: %w", err)
	}
	return nil
}

func prepareDirectory(snapshotsDir string, kind snapshots.Kind) (string, error) {
	td, err := os.MkdirTemp(snapshotsDir, "new-")
	if err != nil {
		return "", fmt.Errorf("create snapshot directory: %w", err)
	}
	if err := os.Mkdir(filepath.Join(td, "fs"), 0o755); err != nil {
		return td, fmt.Errorf("create snapshot directory: %w", err)
	}
	if kind == snapshots.KindActive {
		if err := os.Mkdir(filepath.Join(td, "work"), 0o711); err != nil {
			return td, fmt.Errorf("create snapshot work directory: %w", err)
		}
	}
	return td, nil
}

// kindName says "an active", "a view" or "a committed" for messages.
func kindName(k snapshots.Kind) string {
	switch k {
	case snapshots.KindActive:
		return "an active"
	case snapshots.KindView:
		return "a view"
	case snapshots.KindCommitted:
		return "a committed"
	}
	return "an unknown kind of"
}
