//go:build linux

package snapshotter

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
)

// liveIDs lists the live branches of sb.
func liveIDs(t *testing.T, ctx context.Context, sb sandbox) []string {
	t.Helper()
	tree, err := sb.s.Tree(ctx, sb.root)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range tree.Nodes {
		if n.ID != branch.RootID && n.State == branch.Live {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// forkedAndClosed makes a snapshotter in a new root with a sandbox "sb"
// forked into two branches, closes it, and returns the root, the sandbox's
// snapshot id and the branches.
func forkedAndClosed(t *testing.T, ctx context.Context) (root, id string, kids []branch.Info) {
	t.Helper()
	requireRoot(t)
	root = t.TempDir()
	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, ctx, s, "sb")
	if kids, err = s.Fork(ctx, sb.ctx(""), 2); err != nil {
		t.Fatal(err)
	}
	id = s.mustID(t, ctx, "sb")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return root, id, kids
}

// TestBranchDBMigration: branch trees that an earlier version kept in
// containerd's metadata.db are moved into branches.db at start, intact.
func TestBranchDBMigration(t *testing.T) {
	ctx := context.Background()
	root, id, kids := forkedAndClosed(t, ctx)

	// Put the branch buckets back where the earlier version had them.
	bdb, err := bolt.Open(filepath.Join(root, branchDBName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	mdb, err := bolt.Open(filepath.Join(root, "metadata.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.View(func(btx *bolt.Tx) error {
		return mdb.Update(func(mtx *bolt.Tx) error {
			dst, err := mtx.CreateBucket([]byte(bucketBranchbox))
			if err != nil {
				return err
			}
			return copyBucket(btx.Bucket([]byte(bucketBranchbox)), dst)
		})
	}); err != nil {
		t.Fatal(err)
	}
	bdb.Close()
	mdb.Close()
	if err := os.Remove(filepath.Join(root, branchDBName)); err != nil {
		t.Fatal(err)
	}

	s, err := New(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sb := sandbox{s: s, key: "sb", root: branch.Root{Key: "sb"}}
	if got := liveIDs(t, ctx, sb); len(got) != 2 || got[0] != kids[0].ID || got[1] != kids[1].ID {
		t.Fatalf("live branches after migration: %v, want %s and %s", got, kids[0].ID, kids[1].ID)
	}
	if _, err := os.Stat(s.branchUpper(id, kids[0].ID)); err != nil {
		t.Fatalf("layer of a migrated branch: %v", err)
	}
	_, tr, err := s.ms.TransactionContext(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	left := tr.(*bolt.Tx).Bucket([]byte(bucketBranchbox)) != nil
	tr.Rollback()
	if left {
		t.Fatal("branch buckets still in metadata.db after migration")
	}
	if _, err := s.CommitBranch(ctx, sb.ctx(kids[0].ID)); err != nil {
		t.Fatalf("commit a migrated branch: %v", err)
	}
}

// TestBranchDBDamaged: a branches.db that a power loss left unreadable is
// moved aside; the snapshotter starts with no branches, removes their
// layers, and keeps every snapshot containerd knows.
func TestBranchDBDamaged(t *testing.T) {
	ctx := context.Background()
	root, id, _ := forkedAndClosed(t, ctx)
	garbage := []byte(strings.Repeat("not a bolt page ", 1024))
	if err := os.WriteFile(filepath.Join(root, branchDBName), garbage, 0o600); err != nil {
		t.Fatal(err)
	}

	s, err := New(ctx, root)
	if err != nil {
		t.Fatalf("start over a damaged branches.db: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	sb := sandbox{s: s, key: "sb", root: branch.Root{Key: "sb"}}
	if got := liveIDs(t, ctx, sb); len(got) != 0 {
		t.Fatalf("branches after losing branches.db: %v", got)
	}
	if _, err := os.Stat(filepath.Join(s.root, "branches", id)); !os.IsNotExist(err) {
		t.Fatalf("layers of the lost branches: %v", err)
	}
	aside, _ := filepath.Glob(filepath.Join(root, branchDBName+".damaged-*"))
	if len(aside) != 1 {
		t.Fatalf("damaged file kept aside: %v", aside)
	}
	if _, err := s.Stat(ctx, "sb"); err != nil {
		t.Fatalf("sandbox snapshot after losing branches.db: %v", err)
	}
	if _, err := s.Fork(ctx, sb.ctx(""), 1); err != nil {
		t.Fatalf("fork after recovery: %v", err)
	}
}

// TestBranchDBSystemError: a branches.db the system refuses to open (an
// I/O error, a read-only disk; here a directory in its place, EISDIR)
// stops the start and is not moved aside as damaged: its checkpoints
// would be lost for what a repair may mend.
func TestBranchDBSystemError(t *testing.T) {
	ctx := context.Background()
	root, _, _ := forkedAndClosed(t, ctx)
	db := filepath.Join(root, branchDBName)
	if err := os.Rename(db, db+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(db, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := New(ctx, root)
	if err == nil {
		s.Close()
		t.Fatal("started over a branches.db the system refused to open")
	}
	if !strings.Contains(err.Error(), "repair the disk") {
		t.Errorf("error: %v; want it to say the content is kept", err)
	}
	if aside, _ := filepath.Glob(db + ".damaged-*"); len(aside) != 0 {
		t.Fatalf("moved aside as damaged: %v", aside)
	}
}
