//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/log"

	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// trashDir, in the snapshotter's root, holds discarded layers until they
// are removed. A discard is one rename, so an abort or a commit does not
// wait for a layer's files to be unlinked; the removal runs after it, and
// what a crash leaves here is removed on the next start.
const trashDir = "trash"

// discard moves dir out of the way and removes it in the background. A dir
// that cannot be moved is removed in place.
func (s *store) discard(ctx context.Context, dir string) {
	dst := filepath.Join(s.root, trashDir, fmt.Sprintf("%d-%d", time.Now().UnixNano(), s.trashSeq.Add(1)))
	if err := os.Rename(dir, dst); err != nil {
		if os.IsNotExist(err) {
			if _, serr := os.Lstat(dir); os.IsNotExist(serr) {
				return
			}
		}
		dst = dir
	}
	s.trashWG.Add(1)
	go func() {
		defer s.trashWG.Done()
		if err := os.RemoveAll(dst); err != nil {
			log.G(ctx).WithError(err).WithField("path", dst).Warn("remove discarded layer; the next start retries")
		}
	}()
}

// emptyTrash removes what discards left unfinished (at start).
func (s *store) emptyTrash(ctx context.Context) error {
	dir := filepath.Join(s.root, trashDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		overlay.DetachUnder(ctx, p)
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("remove discarded layer %s: %w", p, err)
		}
	}
	return nil
}
