//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

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
	s.trash.Go(func() {
		if err := os.RemoveAll(dst); err != nil {
			log.G(ctx).WithError(err).WithField("path", dst).Warn("remove discarded layer; the next start retries")
		}
	})
}

// removals counts the background removals of discarded layers and commit
// journals, which Close waits for, and which a commit short of room waits
// for a while (the layer of the branch just aborted may be what frees it).
type removals struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n is back to 0
}

// Go runs f in the background, counted.
func (r *removals) Go(f func()) {
	r.mu.Lock()
	if r.n == 0 {
		r.idle = make(chan struct{})
	}
	r.n++
	r.mu.Unlock()
	go func() {
		defer r.done()
		f()
	}()
}

func (r *removals) done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n--; r.n == 0 {
		close(r.idle)
	}
}

// Idle is closed once no removal runs (at once if none does).
func (r *removals) Idle() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	return r.idle
}

// Wait waits until no removal runs.
func (r *removals) Wait() { <-r.Idle() }

// awaitFreed waits, up to limit, for the removals under way, then syncs
// the filesystem of the root: ext4 counts a removed file's blocks as free
// only once its journal has committed the removal.
func (s *store) awaitFreed(ctx context.Context, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-s.trash.Idle():
	case <-t.C:
	case <-ctx.Done():
		return
	}
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	_ = unix.Syncfs(fd)
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
