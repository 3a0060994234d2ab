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
	"time"
	"unicode"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/snapshotter/overlay"
)

// Snapshotter is an overlayfs snapshotter. It implements
// snapshots.Snapshotter and snapshots.Cleaner; the branch operations on its
// snapshots are Branches', which it embeds, so that one daemon serves both
// APIs over the same metadata.
type Snapshotter struct {
	*store
	*Branches
}

// store is what containerd's methods and the branch operations share: the
// root, its metadata, and the layers' directories.
type store struct {
	root      string
	ms        *storage.MetaStore
	bdb       *bolt.DB
	bdbRoom   *dbRoom // disk allocated beyond bdb's end, for the transactions that free space
	lock      *rootLock
	options   []string
	faultHook func(point string)
	trashSeq  atomic.Uint64
	trash     removals   // background removals of discarded layers and commit journals
	idmapMu   sync.Mutex // serializes the mounting of id-mapped views (idmap_linux.go)
}

// Branches are the branch operations on a Snapshotter's snapshots: fork,
// commit, abort, checkpoints and rollback, their recovery, and the seal of
// forked parents (docs/snapshotter.md).
type Branches struct {
	*store
	locks      rootLocks
	live       overlay.LiveCache   // where branches are mounted
	sealWG     sync.WaitGroup      // background seals of forked parents' superblocks, and write-backs of parents sealed mount by mount
	commitWG   sync.WaitGroup      // decided commits being carried through; a caller may have gone
	undone     undoneCommits       // committing branches whose parent was put back (commitundo.go)
	journalSeq atomic.Uint64       // names the journals of commit attempts
	seals      overlay.SealThreads // the threads that run those seals' remounts
	choice     sealChoice          // the parents sealed mount by mount, their superblock's being slow
	sealer     *overlay.Sealer     // what seals mount by mount, its namespace thread kept
	// quarantined are the trees whose recovery failed (quarantine.go).
	quarantined quarantine
	manifests   manifestCache // checkpoint manifests decoded (manifestcache.go)
}

var (
	_ snapshots.Snapshotter = (*Snapshotter)(nil)
	_ snapshots.Cleaner     = (*Snapshotter)(nil)
)

// Opt configures a Snapshotter.
type Opt func(*config)

type config struct {
	fault func(point string)
	// slowSeal is sealChoice's threshold: 0, never.
	slowSeal time.Duration
}

// WithSlowSeal sets how long a parent's superblock seal may take before
// its next forks seal it mount by mount (sealchoice.go;
// SlowSuperblockSeal is the value docs/seal.md suggests); 0, the default,
// keeps every parent on the superblock's seal.
func WithSlowSeal(d time.Duration) Opt {
	return func(c *config) { c.slowSeal = d }
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
	// Overlay mount data separates options with ',' and layers with ':',
	// and containerd passes the paths unescaped: a mount of such a root
	// would name other directories. (A space is fine.)
	if i := strings.IndexFunc(root, func(r rune) bool { return r == ',' || r == ':' || unicode.IsControl(r) }); i >= 0 {
		return nil, fmt.Errorf("snapshotter root %q: an overlay mount cannot name a path with %q in it: %w", root, root[i], errdefs.ErrInvalidArgument)
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

	options := overlayOptions()

	bdb, err := openBranchDB(ctx, root)
	if err != nil {
		ms.Close()
		return nil, err
	}
	st := &store{root: root, ms: ms, bdb: bdb, bdbRoom: &dbRoom{path: bdb.Path()}, lock: lock, options: options, faultHook: c.fault}
	if fi, err := os.Stat(bdb.Path()); err == nil {
		st.bdbRoom.keep(ctx, fi.Size())
	}
	sealer, err := overlay.NewSealer()
	if err != nil {
		ms.Close()
		bdb.Close()
		return nil, err
	}
	s := &Snapshotter{store: st, Branches: &Branches{store: st, sealer: sealer}}
	s.choice.threshold = c.slowSeal
	defer func() {
		if retErr != nil {
			ms.Close()
			bdb.Close()
		}
	}()
	if err := s.recover(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// recover brings root back to a consistent state after a crash: branch
// metadata an earlier version kept moved, orphans removed, decided commits
// and rollbacks finished, seals matched to the trees.
func (s *Snapshotter) recover(ctx context.Context) error {
	if err := s.migrate(ctx); err != nil {
		return fmt.Errorf("recover snapshotter root %s: %w", s.root, err)
	}
	// Orphans first, so recovery only sees layers that a tree owns; then
	// again, for what recovery let go.
	if err := s.emptyTrash(ctx); err != nil {
		return fmt.Errorf("recover snapshotter root %s: %w", s.root, err)
	}
	if err := s.cleanTempMounts(ctx); err != nil {
		return fmt.Errorf("recover snapshotter root %s: %w", s.root, err)
	}
	if err := s.removeCheckpointTemps(ctx); err != nil {
		return fmt.Errorf("recover snapshotter root %s: %w", s.root, err)
	}
	if err := s.removeJournals(ctx); err != nil {
		return fmt.Errorf("recover snapshotter root %s: %w", s.root, err)
	}
	if err := s.Cleanup(ctx); err != nil {
		return fmt.Errorf("recover snapshotter root %s: %w", s.root, err)
	}
	if err := s.recoverBranches(ctx); err != nil {
		return fmt.Errorf("recover branches in %s: %w", s.root, err)
	}
	if err := s.recoverCheckpoints(ctx); err != nil {
		return fmt.Errorf("recover rollbacks in %s: %w", s.root, err)
	}
	if err := s.Cleanup(ctx); err != nil {
		return fmt.Errorf("recover snapshotter root %s: %w", s.root, err)
	}
	return nil
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

// Close releases the metadata stores and the lock on root.
func (s *Snapshotter) Close() error {
	s.commitWG.Wait()
	s.sealWG.Wait()
	s.seals.Close()
	s.sealer.Close()
	s.trash.Wait()
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
