//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/branchbox/branchbox/branch"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// branchDBName is the file, in the snapshotter's root, that holds the branch
// trees, their tombstones and the checkpoint records.
//
// It is a bolt database of its own, written without fsync. Branches live
// only as long as their processes: a daemon that is killed finds every
// write in the page cache when it restarts (bolt's page writes are whole),
// and a machine that loses power has lost every branch's processes anyway.
// containerd's own snapshot metadata (metadata.db) stays fully synced, so
// images and containers' snapshots are never at risk. The points that are
// synced explicitly are the decisions of a commit and of a rollback, before
// they change a branch: after a power loss a half-applied one is
// completed, not left.
const branchDBName = branch.BranchDBFile

// branchDBMapBytes is the address space the branch database is mapped
// with from the start (not memory: pages past the file are never
// touched), so that it is not mapped again as it grows. A new mapping
// fails on a filesystem remounted read-only after an error (ext4's
// emergency_ro), and bolt, unmapped by then, failed every later call,
// reads included ("database isn't correctly mapped"): with the mapping
// kept, a write fails alone and the trees can still be read.
const branchDBMapBytes = 64 << 20

// openBranchDB opens (creating if needed) the branch database. A file that
// bolt cannot open or that fails its consistency check (a power loss in
// the middle of unsynced writes) is moved aside and replaced by an empty
// one: the layers it described become orphans, which Cleanup removes.
func openBranchDB(ctx context.Context, root string) (*bolt.DB, error) {
	path := filepath.Join(root, branchDBName)
	opts := &bolt.Options{NoSync: true, NoGrowSync: true, NoFreelistSync: true, FreelistType: bolt.FreelistMapType, Timeout: 10 * time.Second,
		InitialMmapSize: branchDBMapBytes}
	db, err := bolt.Open(path, 0o600, opts)
	if err == nil {
		if err = checkDB(db); err != nil {
			db.Close()
		}
	}
	if err == nil {
		return db, nil
	}
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("open %s: another process holds it: %w", path, errdefs.ErrUnavailable)
	}
	// The system's refusal (an I/O error, a read-only or full disk, no
	// permission) says nothing of the file's content: moved aside, every
	// checkpoint it records would be lost for what a repair may mend.
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return nil, fmt.Errorf("open the branch database %s: %w (its content is kept: repair the disk and start again)", path, err)
	}
	aside := fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
	log.G(ctx).WithError(err).WithField("moved-to", aside).Error("branch metadata is damaged (a power loss?); starting with no branches")
	if rerr := os.Rename(path, aside); rerr != nil {
		return nil, fmt.Errorf("move damaged %s aside: %w (after: %v)", path, rerr, err)
	}
	db, err = bolt.Open(path, 0o600, opts)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return db, nil
}

// checkDB runs bolt's page consistency check; it is quick on a database of
// trees. A panic while reading damaged pages counts as damage.
func checkDB(db *bolt.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("check %s: %v", db.Path(), r)
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		var errs []error
		for e := range tx.Check() {
			errs = append(errs, e)
		}
		return errors.Join(errs...)
	})
}

// migrateBranchBuckets moves branch metadata that earlier versions kept in
// containerd's metadata.db into the branch database. The copy is synced
// before the old bucket is deleted, so a crash in between only repeats it.
func migrateBranchBuckets(ctx context.Context, meta *bolt.Tx, bdb *bolt.DB) (bool, error) {
	old := meta.Bucket([]byte(bucketBranchbox))
	if old == nil {
		return false, nil
	}
	if err := bdb.Update(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(bucketBranchbox)) != nil {
			if err := tx.DeleteBucket([]byte(bucketBranchbox)); err != nil {
				return err
			}
		}
		dst, err := tx.CreateBucket([]byte(bucketBranchbox))
		if err != nil {
			return err
		}
		return copyBucket(old, dst)
	}); err != nil {
		return false, fmt.Errorf("copy branch metadata out of metadata.db: %w", err)
	}
	if err := bdb.Sync(); err != nil {
		return false, fmt.Errorf("sync %s: %w", branchDBName, err)
	}
	if err := meta.DeleteBucket([]byte(bucketBranchbox)); err != nil {
		return false, err
	}
	log.G(ctx).Info("moved branch metadata from metadata.db to " + branchDBName)
	return true, nil
}

func copyBucket(src, dst *bolt.Bucket) error {
	return src.ForEach(func(k, v []byte) error {
		if v != nil {
			return dst.Put(k, v)
		}
		sub, err := dst.CreateBucket(k)
		if err != nil {
			return err
		}
		return copyBucket(src.Bucket(k), sub)
	})
}

// withTx runs fn in a transaction of the branch database (tx) with a read
// transaction of containerd's snapshot metadata in ctx, through which fn
// resolves snapshots. Only the branch transaction is writable: branch
// operations never pay for a synced write.
func (s *store) withTx(ctx context.Context, writable bool, fn func(ctx context.Context, tx *bolt.Tx) error) error {
	return s.txn(ctx, false, writable, fn)
}

// withMetaTx is withTx with both transactions writable, for the snapshot
// operations (Remove, Commit, Cleanup) that change containerd's metadata
// and the branch trees together. containerd's metadata commits first: a
// crash before the branch side commits leaves trees whose root is gone,
// which recovery deletes.
func (s *store) withMetaTx(ctx context.Context, fn func(ctx context.Context, tx *bolt.Tx) error) error {
	return s.txn(ctx, true, true, fn)
}

// txn takes the branch database first, then containerd's metadata, always
// in that order: a bolt writer that grows its file waits for that file's
// readers, so the two must never be taken the other way round.
func (s *store) txn(ctx context.Context, metaWritable, writable bool, fn func(ctx context.Context, tx *bolt.Tx) error) error {
	btx, err := s.bdb.Begin(writable)
	if err != nil {
		return fmt.Errorf("begin branch metadata transaction: %w", err)
	}
	ctx, t, err := s.ms.TransactionContext(ctx, metaWritable)
	if err != nil {
		btx.Rollback()
		return err
	}
	rollback := func() {
		if rerr := t.Rollback(); rerr != nil {
			log.G(ctx).WithError(rerr).Warn("rollback metadata transaction")
		}
		if rerr := btx.Rollback(); rerr != nil {
			log.G(ctx).WithError(rerr).Warn("rollback branch metadata transaction")
		}
	}
	if err := fn(ctx, btx); err != nil || !writable {
		rollback()
		return err
	}
	if metaWritable {
		if err := t.Commit(); err != nil {
			btx.Rollback()
			return err
		}
	} else if rerr := t.Rollback(); rerr != nil {
		log.G(ctx).WithError(rerr).Warn("end metadata read transaction")
	}
	size := btx.Size()
	if err := btx.Commit(); err != nil {
		return fmt.Errorf("commit branch metadata: %w", err)
	}
	s.bdbRoom.keep(ctx, size)
	return nil
}
