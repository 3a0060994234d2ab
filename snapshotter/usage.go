//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
)

// Usage returns the resources taken by the snapshot identified by key. For
// an active snapshot it scans the upper directory and, for a sandbox's
// root, the layers of its branches and its checkpoints (their layers and
// memory images): they are the sandbox's, go with it, and are written by
// it, so whoever charges a container for its writable layer through this
// call (containerd's CRI for the kubelet's ephemeral-storage limits and
// eviction, `nerdctl ps -s`) sees what its branches write. For a committed
// snapshot it returns what was recorded at commit.
func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	if err := validateKey("usage", key); err != nil {
		return snapshots.Usage{}, err
	}
	var (
		id    string
		info  snapshots.Info
		usage snapshots.Usage
	)
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) (err error) {
		id, info, usage, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return snapshots.Usage{}, fmt.Errorf("usage of %q: %w", key, err)
	}
	if info.Kind != snapshots.KindActive {
		return usage, nil
	}
	usage, err = diskUsage(ctx, s.upperPath(id), filepath.Join(s.root, "branches", id), s.checkpointBase(id))
	if err != nil {
		return snapshots.Usage{}, fmt.Errorf("usage of %q: %w", key, err)
	}
	return usage, nil
}

// diskUsage is the blocks and inodes under roots, each inode counted once,
// as containerd's own snapshotters count them (continuity's fs.DiskUsage).
// Unlike that, an entry removed while it is walked, or a root that does
// not exist, is not an error: branches end and their layers are removed at
// any moment.
func diskUsage(ctx context.Context, roots ...string) (snapshots.Usage, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]struct{}{}
	var u snapshots.Usage
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				return nil
			}
			k := inode{st.Dev, st.Ino}
			if _, ok := seen[k]; ok {
				return nil
			}
			seen[k] = struct{}{}
			u.Inodes++
			u.Size += st.Blocks * 512 // st_blocks is in 512-byte units, whatever the block size
			return nil
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return snapshots.Usage{}, fmt.Errorf("scan %s: %w", root, err)
		}
	}
	return u, nil
}
