//go:build linux

package snapshotter

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
)

// Persistence of checkpoints: each tree's checkpoint document in the branch
// database, what its layers are kept for, and the directories they live in.

type checkpointRecord struct {
	Name    string    `json:"name"`
	Branch  string    `json:"context"`
	Parent  string    `json:"parent,omitempty"`
	Seq     uint64    `json:"seq"`
	Created time.Time `json:"created"`
	Size    int64     `json:"size"`
	Entries int64     `json:"entries"`
	// Chain is this layer's sequence number and its parents', newest first.
	Chain []uint64 `json:"chain"`
	// MemoryBytes is the size of the memory image kept in its directory's
	// memory/ (0: none).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
}

// deletedParent is what a checkpoint reports as its parent once that was
// deleted: not a valid name, so never taken for a later checkpoint that
// reuses the old one.
const deletedParent = "(deleted)"

type checkpointDoc struct {
	Next        uint64                       `json:"next"`
	Checkpoints map[string]*checkpointRecord `json:"checkpoints"`
	// Deleted holds, by sequence number, the records of deleted checkpoints
	// whose layers remaining checkpoints' chains still stack. They have no
	// name: nothing looks them up but garbage collection and Cleanup.
	Deleted map[uint64]*checkpointRecord `json:"deleted,omitempty"`
	// Heads maps a branch to the checkpoint it last took or rolled back
	// to: the base of its next checkpoint.
	Heads map[string]string `json:"heads"`
	// Pending maps a branch to the checkpoint a decided rollback is
	// bringing it back to; recovery completes it.
	Pending map[string]string `json:"pending"`
}

func loadCheckpoints(tx *bolt.Tx, rootID string) (*checkpointDoc, error) {
	d := &checkpointDoc{Next: 1, Checkpoints: map[string]*checkpointRecord{}, Deleted: map[uint64]*checkpointRecord{}, Heads: map[string]string{}, Pending: map[string]string{}}
	b := nestedBucket(tx, bucketBranchbox, bucketCheckpoints)
	if b == nil {
		return d, nil
	}
	v := b.Get([]byte(rootID))
	if v == nil {
		return d, nil
	}
	if err := json.Unmarshal(v, d); err != nil {
		return nil, fmt.Errorf("decode checkpoints of snapshot %s: %v: %w", rootID, err, errdefs.ErrDataLoss)
	}
	if d.Checkpoints == nil {
		d.Checkpoints = map[string]*checkpointRecord{}
	}
	if d.Heads == nil {
		d.Heads = map[string]string{}
	}
	if d.Pending == nil {
		d.Pending = map[string]string{}
	}
	if d.Deleted == nil {
		d.Deleted = map[uint64]*checkpointRecord{}
	}
	return d, nil
}

// needed is the set of layers the checkpoints' chains stack.
func (d *checkpointDoc) needed() map[uint64]bool {
	out := map[uint64]bool{}
	for _, c := range d.Checkpoints {
		for _, seq := range c.Chain {
			out[seq] = true
		}
	}
	return out
}

// held is the bytes the checkpoints' layers and memory images hold, and
// of it those of deleted checkpoints that remaining ones build on.
func (d *checkpointDoc) held() (bytes, deleted int64) {
	for _, c := range d.Checkpoints {
		bytes += c.Size + c.MemoryBytes
	}
	for _, c := range d.Deleted {
		deleted += c.Size + c.MemoryBytes
	}
	return bytes + deleted, deleted
}

// checkBounds refuses one more checkpoint, of newBytes (0: not yet
// written), where it would take d past the bounds of o.
func (d *checkpointDoc) checkBounds(o branch.CheckpointOptions, newBytes int64) error {
	bytes, deleted := d.held()
	return branch.CheckCheckpointBounds(o, len(d.Checkpoints), bytes, deleted, newBytes)
}

// collect drops the deleted records no checkpoint's chain needs any more
// and returns their sequence numbers: their layers are then orphans.
func (d *checkpointDoc) collect() []uint64 {
	needed := d.needed()
	var gone []uint64
	for seq := range d.Deleted {
		if !needed[seq] {
			delete(d.Deleted, seq)
			gone = append(gone, seq)
		}
	}
	return gone
}

func storeCheckpoints(tx *bolt.Tx, rootID string, d *checkpointDoc) error {
	b, err := tx.CreateBucketIfNotExists([]byte(bucketBranchbox))
	if err != nil {
		return err
	}
	cb, err := b.CreateBucketIfNotExists([]byte(bucketCheckpoints))
	if err != nil {
		return err
	}
	v, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return cb.Put([]byte(rootID), v)
}

func deleteCheckpoints(tx *bolt.Tx, rootID string) error {
	if b := nestedBucket(tx, bucketBranchbox, bucketCheckpoints); b != nil {
		return b.Delete([]byte(rootID))
	}
	return nil
}

// pruneCheckpoints drops the records of checkpoints whose branch no longer
// has a layer, and the deleted ones only those stacked; their directories
// become orphans. storeTree calls it, so a branch's checkpoints end in the
// transaction that ends it.
func pruneCheckpoints(tx *bolt.Tx, rootID string, t *branch.Tree) error {
	d, err := loadCheckpoints(tx, rootID)
	if err != nil || len(d.Checkpoints) == 0 && len(d.Heads) == 0 && len(d.Deleted) == 0 {
		return err
	}
	changed := false
	for name, c := range d.Checkpoints {
		if _, ok := t.Nodes[c.Branch]; !ok {
			delete(d.Checkpoints, name)
			changed = true
		}
	}
	for id := range d.Heads {
		if _, ok := t.Nodes[id]; !ok {
			delete(d.Heads, id)
			delete(d.Pending, id)
			changed = true
		}
	}
	if len(d.collect()) > 0 {
		changed = true
	}
	if !changed {
		return nil
	}
	return storeCheckpoints(tx, rootID, d)
}

func (s *store) checkpointBase(rootID string) string {
	return filepath.Join(s.root, "checkpoints", rootID)
}

func (s *store) checkpointDir(rootID string, seq uint64) string {
	return filepath.Join(s.checkpointBase(rootID), strconv.FormatUint(seq, 10))
}

// setHead records that branch id now builds its next checkpoint on name
// (a commit of a branch forked from name); nothing if name is "".
func setHead(tx *bolt.Tx, rootID, id, name string) error {
	if name == "" {
		return nil
	}
	d, err := loadCheckpoints(tx, rootID)
	if err != nil {
		return err
	}
	if _, ok := d.Checkpoints[name]; !ok {
		return nil
	}
	d.Heads[id] = name
	return storeCheckpoints(tx, rootID, d)
}
