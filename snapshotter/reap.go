//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
)

// Reap removes every snapshot directory and branch layer that no metadata
// owns — what a crash, a failed removal, or a sandbox that went without
// its branches left — and returns what it removed. The daemon runs it at
// start and on a timer; containerd calls it (as Cleanup) after collecting.
func (s *Snapshotter) Reap(ctx context.Context) ([]string, error) {
	s.retryQuarantined(ctx)
	var removals []string
	// A write transaction keeps creators out while the directory is scanned,
	// so an in-flight "new-" directory is never mistaken for an orphan.
	err := s.withMetaTx(ctx, func(ctx context.Context, tx *bolt.Tx) (err error) {
		removals, err = s.orphanDirectories(ctx, tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cleanup: %w", err)
	}
	removed := s.removeAll(ctx, removals)
	if len(removed) > 0 {
		log.G(ctx).WithField("removed", removed).Info("reaped orphaned snapshot state")
	}
	return removed, nil
}

// removeAll removes dirs and returns those it removed.
func (s *store) removeAll(ctx context.Context, dirs []string) []string {
	var removed []string
	for _, dir := range dirs {
		if err := os.RemoveAll(dir); err != nil {
			log.G(ctx).WithError(err).WithField("path", dir).Warn("failed to remove snapshot directory; Cleanup will retry")
			continue
		}
		removed = append(removed, dir)
	}
	return removed
}

// orphanDirectories lists the snapshot directories and branch layers that
// no metadata owns.
func (s *Snapshotter) orphanDirectories(ctx context.Context, tx *bolt.Tx) ([]string, error) {
	ids, err := storage.IDMap(ctx)
	if err != nil && !errdefs.IsNotFound(err) { // NotFound: no snapshot yet
		return nil, err
	}
	dir := filepath.Join(s.root, "snapshots")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var orphans []string
	for _, e := range entries {
		if _, ok := ids[e.Name()]; ok {
			continue
		}
		orphans = append(orphans, filepath.Join(dir, e.Name()))
	}
	branchOrphans, err := s.orphanBranchDirectories(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	ckOrphans, err := s.orphanCheckpointDirectories(tx, ids)
	if err != nil {
		return nil, err
	}
	branchOrphans = append(branchOrphans, ckOrphans...)
	return append(orphans, branchOrphans...), nil
}
