//go:build linux

package snapshotter

import (
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// syncEachMax is the most entries a new checkpoint's layer has for each
// file to be synced on its own; a larger one syncs its whole filesystem.
const syncEachMax = 256

// syncLayer writes a new checkpoint's layer (dir: its files, manifest and
// memory image) to disk before the checkpoint is recorded. The branch
// database is written without fsync (branchdb.go), and a checkpoint
// whose record or files were still in the page cache was lost with them
// when the node's disk went read-only after an error or its power was cut
// (TestReadOnlyDisk); a record that reached the disk before its files
// would roll back to empty or missing ones. A layer of few entries has
// each synced, its own data alone; a larger one its filesystem at once
// (syncfs: one call, but it writes back what else is dirty there too).
// The paths in also (its parent directory) are synced with it.
func syncLayer(dir string, entries int64, also ...string) error {
	if entries > syncEachMax {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Syncfs(fd); err != nil {
			return fmt.Errorf("sync the filesystem of %s: %w", dir, err)
		}
		return nil
	}
	paths := also
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Symbolic links and special files are their directory's entries
		// alone (and opening a FIFO would block).
		if d.IsDir() || d.Type().IsRegular() {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	// At once: a journaling filesystem commits the fsyncs that wait
	// together in one transaction, where one after the other each paid
	// for a commit of its own (about 0.15 ms each here).
	var g errgroup.Group
	g.SetLimit(syncParallel)
	for _, p := range paths {
		g.Go(func() error { return syncPath(p) })
	}
	return g.Wait()
}

// syncParallel bounds the fsyncs syncLayer runs at once.
const syncParallel = 16

// syncPath fsyncs the file or directory at p.
func syncPath(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return &fs.PathError{Op: "fsync", Path: p, Err: err}
	}
	return nil
}
