//go:build linux

package snapshotter

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
)

// Persistence of the branch trees: each tree, its tombstones and its records
// in the branch database (branches.db, branchdb.go), read and written inside
// bolt transactions.

// loadTree reads the tree of a root snapshot, nil if it has none. Its
// tombstones are read through tx, so the tree must not be asked about
// ended nodes after tx ends.
func loadTree(tx *bolt.Tx, rootID string) (*branch.Tree, error) {
	trees := nestedBucket(tx, bucketBranchbox, bucketTrees)
	if trees == nil {
		return nil, nil
	}
	v := trees.Get([]byte(rootID))
	if v == nil {
		return nil, nil
	}
	var t branch.Tree
	if err := json.Unmarshal(v, &t); err != nil {
		return nil, fmt.Errorf("decode branch tree of snapshot %s: %v: %w", rootID, err, errdefs.ErrDataLoss)
	}
	t.SetTombstones(func(id string) *branch.Node {
		ended := nestedBucket(tx, bucketBranchbox, bucketEnded, rootID)
		if ended == nil {
			return nil
		}
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return nil
		}
		var node branch.Node
		if v := ended.Get(idKey(n)); v == nil || json.Unmarshal(v, &node) != nil {
			return nil
		}
		return &node
	})
	return &t, nil
}

// storeTree writes the tree and moves the nodes that ended into its
// tombstones, keeping the newest maxTombstones.
func storeTree(tx *bolt.Tx, rootID string, t *branch.Tree) error {
	b, err := tx.CreateBucketIfNotExists([]byte(bucketBranchbox))
	if err != nil {
		return err
	}
	trees, err := b.CreateBucketIfNotExists([]byte(bucketTrees))
	if err != nil {
		return err
	}
	v, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if err := trees.Put([]byte(rootID), v); err != nil {
		return err
	}
	if err := pruneCheckpoints(tx, rootID, t); err != nil {
		return err
	}
	endedNodes := t.TakeEnded()
	if len(endedNodes) == 0 {
		return nil
	}
	all, err := b.CreateBucketIfNotExists([]byte(bucketEnded))
	if err != nil {
		return err
	}
	ended, err := all.CreateBucketIfNotExists([]byte(rootID))
	if err != nil {
		return err
	}
	for _, n := range endedNodes {
		id, err := strconv.ParseUint(n.ID, 10, 64)
		if err != nil {
			return fmt.Errorf("branch id %q: %w", n.ID, errdefs.ErrInternal)
		}
		v, err := json.Marshal(n)
		if err != nil {
			return err
		}
		if err := ended.Put(idKey(id), v); err != nil {
			return err
		}
	}
	// Keys are big-endian ids, so the first ones are the oldest: keep the
	// last maxTombstones.
	c := ended.Cursor()
	k, _ := c.Last()
	for i := 1; i < maxTombstones && k != nil; i++ {
		k, _ = c.Prev()
	}
	if k == nil {
		return nil
	}
	var drop [][]byte
	for k, _ = c.Prev(); k != nil; k, _ = c.Prev() {
		drop = append(drop, append([]byte(nil), k...))
	}
	for _, k := range drop {
		if err := ended.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// tombstones lists the ended nodes of a tree, oldest first.
func tombstones(tx *bolt.Tx, rootID string) ([]branch.Node, error) {
	ended := nestedBucket(tx, bucketBranchbox, bucketEnded, rootID)
	if ended == nil {
		return nil, nil
	}
	var out []branch.Node
	err := ended.ForEach(func(_, v []byte) error {
		var n branch.Node
		if err := json.Unmarshal(v, &n); err != nil {
			return fmt.Errorf("decode tombstone: %v: %w", err, errdefs.ErrDataLoss)
		}
		out = append(out, n)
		return nil
	})
	return out, err
}

func deleteTree(tx *bolt.Tx, rootID string) error {
	if err := deleteCheckpoints(tx, rootID); err != nil {
		return err
	}
	if trees := nestedBucket(tx, bucketBranchbox, bucketTrees); trees != nil {
		if err := trees.Delete([]byte(rootID)); err != nil {
			return err
		}
	}
	if all := nestedBucket(tx, bucketBranchbox, bucketEnded); all != nil && all.Bucket([]byte(rootID)) != nil {
		return all.DeleteBucket([]byte(rootID))
	}
	return nil
}

// allTrees lists every stored tree by root snapshot id, and apart from
// them the trees that cannot be decoded, with why.
func allTrees(tx *bolt.Tx) (map[string]*branch.Tree, map[string]error, error) {
	out, bad := map[string]*branch.Tree{}, map[string]error{}
	trees := nestedBucket(tx, bucketBranchbox, bucketTrees)
	if trees == nil {
		return out, bad, nil
	}
	var ids []string
	if err := trees.ForEach(func(k, _ []byte) error { ids = append(ids, string(k)); return nil }); err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		t, err := loadTree(tx, id)
		if err != nil {
			bad[id] = err
			continue
		}
		out[id] = t
	}
	return out, bad, nil
}

func nestedBucket(tx *bolt.Tx, names ...string) *bolt.Bucket {
	b := tx.Bucket([]byte(names[0]))
	for _, n := range names[1:] {
		if b == nil {
			return nil
		}
		b = b.Bucket([]byte(n))
	}
	return b
}

func idKey(id uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], id)
	return k[:]
}
