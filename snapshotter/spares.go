//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// spareDir, in the snapshotter's root, holds empty branch layers (a
// directory with an fs and a work directory) made ahead of forks. A fork
// renames one into place: one rename instead of three mkdirs and a chown,
// which were a third of a fork's CPU time. The spares are made again in the
// background after the fork has replied. They belong to no tree: what a
// crash or a stop leaves here is removed on the next start.
const spareDir = "spare"

// spareTarget is how many spares are kept: as many as the shim's pool of
// branch inits, the largest fork that is fast end to end.
const spareTarget = 16

// spareLayers is the set of ready spares of one snapshotter root.
type spareLayers struct {
	dir      string
	uid, gid int // owner of every spare's fs directory

	mu      sync.Mutex
	ready   []string
	seq     uint64
	filling bool
	closed  bool
	wg      sync.WaitGroup
}

// resetSpares removes what an earlier process left in root's spare
// directory and returns an empty set; spares are made on the first take.
func resetSpares(ctx context.Context, root string) (*spareLayers, error) {
	dir := filepath.Join(root, spareDir)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("remove spare branch layers %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	return &spareLayers{dir: dir, uid: os.Geteuid(), gid: os.Getegid()}, nil
}

// take returns a ready spare, if there is one.
func (p *spareLayers) take() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.ready)
	if p.closed || n == 0 {
		return "", false
	}
	sp := p.ready[n-1]
	p.ready = p.ready[:n-1]
	return sp, true
}

// refill starts making spares up to spareTarget, unless that is under way.
// Forks call it once they have replied: made during a fork, the spares
// would take the CPU the fork's remount needs.
func (p *spareLayers) refill(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.filling || len(p.ready) >= spareTarget {
		return
	}
	p.filling = true
	p.wg.Add(1)
	go p.fill(context.WithoutCancel(ctx))
}

// fill makes spares until there are spareTarget of them or p is closed.
func (p *spareLayers) fill(ctx context.Context) {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		if p.closed || len(p.ready) >= spareTarget {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.seq++
		sp := filepath.Join(p.dir, strconv.FormatUint(p.seq, 10))
		p.mu.Unlock()
		if err := makeBranchDir(sp, p.uid, p.gid); err != nil {
			// Forks make their layers themselves meanwhile; the next
			// fork tries again.
			log.G(ctx).WithError(err).WithField("path", sp).Warn("make a spare branch layer")
			_ = os.RemoveAll(sp)
			p.mu.Lock()
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		p.ready = append(p.ready, sp)
		p.mu.Unlock()
	}
}

// close stops the making of spares and waits for it. The spares stay on
// disk until the next start.
func (p *spareLayers) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
}

// placeBranchDir makes the empty branch layer dir, owned by uid and gid:
// a spare renamed into place if there is one, else made there.
func (s *Snapshotter) placeBranchDir(ctx context.Context, dir string, uid, gid int) error {
	sp, ok := s.spares.take()
	if !ok {
		return makeBranchDir(dir, uid, gid)
	}
	// NOREPLACE: a directory already at dir is an error, as with mkdir.
	err := unix.Renameat2(unix.AT_FDCWD, sp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.ENOENT) {
		// The root's branches directory does not exist before its first
		// fork.
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			_ = os.RemoveAll(sp)
			return fmt.Errorf("create branch directory: %w", err)
		}
		err = unix.Renameat2(unix.AT_FDCWD, sp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
	}
	if err != nil {
		_ = os.RemoveAll(sp)
		return makeBranchDir(dir, uid, gid)
	}
	if uid != s.spares.uid || gid != s.spares.gid {
		if err := os.Lchown(filepath.Join(dir, "fs"), uid, gid); err != nil {
			return fmt.Errorf("chown branch layer: %w", err)
		}
	}
	return nil
}
