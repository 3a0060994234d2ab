//go:build linux

// Package snapshotter implements the branch snapshotter: a containerd
// snapshotter on overlayfs whose metadata lives in containerd's bolt-backed
// snapshot storage. Branch operations build on the same directory layout:
//
//	<root>/lock             held (flock) by the one process that owns root
//	<root>/metadata.db      core/snapshots/storage metadata
//	<root>/branches.db      branch trees and checkpoint records (branchdb.go)
//	<root>/snapshots/<id>/fs    upper (or only) layer of snapshot <id>
//	<root>/snapshots/<id>/work  overlay workdir of an active snapshot
//	<root>/snapshots/new-*      half-created snapshot, removed on recovery
//	<root>/trash/*              discarded layers being removed (trash.go)
package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Snapshotter is an overlayfs snapshotter. It implements
// snapshots.Snapshotter and snapshots.Cleaner.
type Snapshotter struct {
	root       string
	ms         *storage.MetaStore
	bdb        *bolt.DB
	lock       *rootLock
	options    []string
	locks      rootLocks
	live       overlay.LiveCache // where contexts are mounted
	faultHook  func(point string)
	trashSeq   atomic.Uint64
	trashWG    sync.WaitGroup      // background removals of discarded layers and commit journals
	sealWG     sync.WaitGroup      // background seals of forked parents' superblocks
	commitWG   sync.WaitGroup      // decided commits being carried through; a caller may have gone
	undone     undoneCommits       // committing branches whose parent was put back (commitundo.go)
	journalSeq atomic.Uint64       // names the journals of commit attempts
	seals      overlay.SealThreads // the threads that run those seals' remounts
	idmapMu    sync.Mutex          // serializes the mounting of id-mapped views (idmap_linux.go)
	// quarantined are the trees whose recovery failed (quarantine.go).
	quarantined quarantine
}

var (
	_ snapshots.Snapshotter = (*Snapshotter)(nil)
	_ snapshots.Cleaner     = (*Snapshotter)(nil)
)

// Opt configures a Snapshotter.
type Opt func(*config)

type config struct {
	fault func(point string)
}

// New opens (creating if needed) a snapshotter rooted at root. It takes an
// exclusive lock on root, so a second snapshotter on the same root fails with
// errdefs.ErrFailedPrecondition, and it recovers from a previous crash by
// removing snapshot directories that the metadata does not know.
func New(ctx context.Context, root string, opts ...Opt) (_ *Snapshotter, retErr error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("snapshotter root %q must be an absolute path: %w", root, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create snapshotter root %s: %w", root, err)
	}
	lock, err := lockRoot(root)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			lock.release()
		}
	}()

	supportsDType, err := fs.SupportsDType(root)
	if err != nil {
		return nil, fmt.Errorf("check d_type support of %s: %w", root, err)
	}
	if !supportsDType {
		return nil, fmt.Errorf("%s does not support d_type, which overlayfs needs (on xfs, reformat with ftype=1): %w", root, errdefs.ErrNotImplemented)
	}
	if err := os.Mkdir(filepath.Join(root, "snapshots"), 0o700); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("create snapshots directory: %w", err)
	}
	ms, err := storage.NewMetaStore(filepath.Join(root, "metadata.db"))
	if err != nil {
		return nil, fmt.Errorf("open snapshot metadata in %s: %w", root, err)
	}

	var options []string
	// index=off keeps overlay from refusing to remount an upper with a
	// different lower stack, which branches do routinely.
	if !hasOption(options, "index") && supportsIndex() {
		options = append(options, "index=off")
	}

	bdb, err := openBranchDB(ctx, root)
	if err != nil {
		ms.Close()
		return nil, err
	}
	s := &Snapshotter{root: root, ms: ms, bdb: bdb, lock: lock, options: options, faultHook: c.fault}
	defer func() {
		if retErr != nil {
			ms.Close()
			bdb.Close()
		}
	}()
	if err := s.migrate(ctx); err != nil {
		return nil, fmt.Errorf("recover snapshotter root %s: %w", root, err)
	}
	// Orphans first, so recovery only sees layers that a tree owns; then
	// again, for what recovery let go.
	if err := s.emptyTrash(ctx); err != nil {
		return nil, fmt.Errorf("recover snapshotter root %s: %w", root, err)
	}
	if err := s.cleanTempMounts(ctx); err != nil {
		return nil, fmt.Errorf("recover snapshotter root %s: %w", root, err)
	}
	if err := s.removeCheckpointTemps(ctx); err != nil {
		return nil, fmt.Errorf("recover snapshotter root %s: %w", root, err)
	}
	if err := s.removeJournals(ctx); err != nil {
		return nil, fmt.Errorf("recover snapshotter root %s: %w", root, err)
	}
	if err := s.Cleanup(ctx); err != nil {
		return nil, fmt.Errorf("recover snapshotter root %s: %w", root, err)
	}
	if err := s.recoverBranches(ctx); err != nil {
		return nil, fmt.Errorf("recover branches in %s: %w", root, err)
	}
	if err := s.recoverCheckpoints(ctx); err != nil {
		return nil, fmt.Errorf("recover rollbacks in %s: %w", root, err)
	}
	if err := s.Cleanup(ctx); err != nil {
		return nil, fmt.Errorf("recover snapshotter root %s: %w", root, err)
	}
	return s, nil
}

// Root returns the directory the snapshotter owns.
func (s *Snapshotter) Root() string { return s.root }

// Stat returns the info for an active or committed snapshot by key.
func (s *Snapshotter) Stat(ctx context.Context, key string) (info snapshots.Info, err error) {
	if err := validateKey("stat", key); err != nil {
		return info, err
	}
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, info, _, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return info, fmt.Errorf("stat %q: %w", key, err)
	}
	return info, nil
}

// Update changes the labels of a snapshot.
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (newInfo snapshots.Info, err error) {
	if err := validateKey("update", info.Name); err != nil {
		return newInfo, err
	}
	if err := validateLabels("update", info.Labels); err != nil {
		return newInfo, err
	}
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		newInfo, err = storage.UpdateInfo(ctx, info, fieldpaths...)
		return err
	})
	if err != nil {
		return newInfo, fmt.Errorf("update %q: %w", info.Name, err)
	}
	return newInfo, nil
}

// Usage returns the resources taken by the snapshot identified by key. For an
// active snapshot it scans the upper directory; for a committed one it returns
// what was recorded at commit.
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
	if info.Kind == snapshots.KindActive {
		du, err := fs.DiskUsage(ctx, s.upperPath(id))
		if err != nil {
			return snapshots.Usage{}, fmt.Errorf("usage of %q: scan upper directory: %w", key, err)
		}
		usage = snapshots.Usage(du)
	}
	return usage, nil
}

// Prepare creates an active snapshot on parent and returns its mounts.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.createSnapshot(ctx, snapshots.KindActive, key, parent, opts)
}

// View creates a read-only snapshot on parent and returns its mounts.
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	return s.createSnapshot(ctx, snapshots.KindView, key, parent, opts)
}

// Mounts returns the mounts of an active or view snapshot.
func (s *Snapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	if err := validateKey("mounts", key); err != nil {
		return nil, err
	}
	var (
		snap   storage.Snapshot
		idmap  idMapping
		sealed bool
	)
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if snap, err = storage.GetSnapshot(ctx, key); err != nil {
			return err
		}
		_, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		idmap = s.idMappingOf(snap, info.Labels)
		t, err := loadTree(tx, snap.ID)
		sealed = t != nil && t.Sealed(branch.RootID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mounts of %q: %w", key, err)
	}
	m := s.mounts(snap, idmap)
	if sealed {
		// Its layer is its branches' lower: a new mount must not write it.
		m[0].Options = withReadonly(m[0].Options)
	}
	return m, nil
}

// Commit turns the active snapshot key into the committed snapshot name.
// The caller must have unmounted it: containerd allows committing a mounted
// snapshot, but its upper may still change under the recorded usage.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	if err := validateKey("commit", key); err != nil {
		return err
	}
	if err := validateKey("commit", name); err != nil {
		return err
	}
	if err := validateOpts("commit", opts); err != nil {
		return err
	}
	err := s.withMetaTx(ctx, func(ctx context.Context, tx *bolt.Tx) error {
		id, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		if t, err := loadTree(tx, id); err != nil {
			return err
		} else if t != nil && len(t.Layered()) > 0 {
			return fmt.Errorf("snapshot has %d live branches; commit or abort them first: %w", len(t.Layered()), errdefs.ErrFailedPrecondition)
		}
		if info.Kind != snapshots.KindActive {
			return fmt.Errorf("snapshot is %s snapshot; only active snapshots can be committed: %w", kindName(info.Kind), errdefs.ErrFailedPrecondition)
		}
		usage, err := fs.DiskUsage(ctx, s.upperPath(id))
		if err != nil {
			return fmt.Errorf("scan upper directory: %w", err)
		}
		_, err = storage.CommitActive(ctx, key, name, snapshots.Usage(usage), opts...)
		return err
	})
	if err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	return nil
}

// Remove deletes the snapshot identified by key. Its directory is removed
// once the metadata transaction has committed; a crash in between leaves a
// directory that the next start (or Cleanup) removes.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	if err := validateKey("remove", key); err != nil {
		return err
	}
	var (
		removals []string
		removed  string
	)
	err := s.withMetaTx(ctx, func(ctx context.Context, tx *bolt.Tx) error {
		id, _, err := storage.Remove(ctx, key)
		removed = id
		if err != nil {
			if errdefs.IsFailedPrecondition(err) {
				return fmt.Errorf("%w (remove its children first)", err)
			}
			return err
		}
		// Its branch tree goes with it; the layers become orphans below.
		if err := deleteTree(tx, id); err != nil {
			return err
		}
		removals, err = s.orphanDirectories(ctx, tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("remove %q: %w", key, err)
	}
	s.quarantined.lift(removed)
	s.removeAll(ctx, removals)
	return nil
}

// Walk calls fn for every snapshot that matches all the filters.
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	return s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		return storage.WalkInfo(ctx, fn, filters...)
	})
}

// Cleanup removes every snapshot directory the metadata does not know:
// leftovers of removals and of snapshots half created before a crash.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	_, err := s.Reap(ctx)
	return err
}

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

// Close releases the metadata stores and the lock on root.
func (s *Snapshotter) Close() error {
	s.commitWG.Wait()
	s.sealWG.Wait()
	s.seals.Close()
	s.trashWG.Wait()
	err := errors.Join(s.ms.Close(), s.bdb.Close())
	s.lock.release()
	return err
}

// migrate moves branch metadata an earlier version kept in metadata.db.
func (s *Snapshotter) migrate(ctx context.Context) error {
	_, t, err := s.ms.TransactionContext(ctx, true)
	if err != nil {
		return err
	}
	tx, ok := t.(*bolt.Tx)
	if !ok {
		t.Rollback()
		return fmt.Errorf("metadata transaction is %T, not a bolt transaction: %w", t, errdefs.ErrInternal)
	}
	moved, err := migrateBranchBuckets(ctx, tx, s.bdb)
	if err != nil || !moved {
		t.Rollback()
		return err
	}
	return t.Commit()
}

// removeAll removes dirs and returns those it removed.
func (s *Snapshotter) removeAll(ctx context.Context, dirs []string) []string {
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

func (s *Snapshotter) createSnapshot(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) (_ []mount.Mount, retErr error) {
	op := "prepare"
	if kind == snapshots.KindView {
		op = "view"
	}
	if err := validateKey(op, key); err != nil {
		return nil, err
	}
	if parent != "" {
		if err := validateKey(op, parent); err != nil {
			return nil, err
		}
	}
	if err := validateOpts(op, opts); err != nil {
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
		if parent != "" {
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

// mounts are the mounts of a snapshot. With an id mapping its image layers
// are id-mapped (idmap_linux.go); a layer of its own (a bind of an active
// snapshot without parents) is not, as it holds host ids.
func (s *Snapshotter) mounts(snap storage.Snapshot, idmap idMapping) []mount.Mount {
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

func (s *Snapshotter) upperPath(id string) string {
	return filepath.Join(s.root, "snapshots", id, "fs")
}

func (s *Snapshotter) workPath(id string) string {
	return filepath.Join(s.root, "snapshots", id, "work")
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
