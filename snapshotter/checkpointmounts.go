//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
)

// CheckpointMounts returns a read-only mount of the state of checkpoint
// name, one of branch c's own: its layers over the branch's lowers, as a
// rollback mounts it. Whoever mounts it (a push, through containerd's diff
// service) reads the checkpoint's immutable layers, never a live upper.
func (s *Branches) CheckpointMounts(ctx context.Context, c branch.Ref, name string) ([]mount.Mount, error) {
	var out []mount.Mount
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		r, id, err := s.resolve(ctx, c)
		if err != nil {
			return err
		}
		if err := s.usable(r); err != nil {
			return err
		}
		tree, d, err := s.loadBoth(tx, r)
		if err != nil {
			return err
		}
		if _, err := tree.Get(id); err != nil {
			return err
		}
		if err := s.ensureIDMapView(ctx, r); err != nil {
			return err
		}
		ck := d.Checkpoints[name]
		if ck == nil {
			return fmt.Errorf("no checkpoint %q: %w", name, errdefs.ErrNotFound)
		}
		if ck.Branch != id {
			return fmt.Errorf("checkpoint %q is of branch %s, not %s: %w", name, ck.Branch, id, errdefs.ErrInvalidArgument)
		}
		lowers := make([]string, 0, len(ck.Chain)+8)
		for _, seq := range ck.Chain {
			lowers = append(lowers, filepath.Join(s.checkpointDir(r.id(), seq), "fs"))
		}
		lowers = append(lowers, s.lowerDirs(r, tree, id)...)
		opts := append([]string{"ro", "lowerdir=" + strings.Join(lowers, ":")}, s.options...)
		out = []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mounts of checkpoint %q of %s: %w", name, c, err)
	}
	return out, nil
}
