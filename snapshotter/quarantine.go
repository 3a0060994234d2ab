//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/branchbox/branchbox/branch"
)

// quarantine holds the branch trees whose recovery failed. A tree that
// cannot be recovered (a commit that cannot be completed, a rollback that
// cannot be finished, a record that cannot be decoded) must not keep the
// daemon from starting: every other tree, and every containerd snapshot
// call, is still served. A quarantined tree refuses branch operations with
// the cause, its layers are kept (nothing is reaped), and its recovery is
// tried again at every reap until it succeeds or its root snapshot is
// removed.
type quarantine struct {
	mu    sync.Mutex
	trees map[string]error // root snapshot id -> why its recovery failed
}

func (q *quarantine) add(id string, cause error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.trees == nil {
		q.trees = map[string]error{}
	}
	q.trees[id] = cause
}

func (q *quarantine) lift(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.trees, id)
}

// cause is why tree id is quarantined, nil if it is not.
func (q *quarantine) cause(id string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.trees[id]
}

func (q *quarantine) ids() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]string, 0, len(q.trees))
	for id := range q.trees {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// usable refuses a branch operation on a quarantined tree, saying why.
func (s *Branches) usable(r rootSnap) error {
	cause := s.quarantined.cause(r.id())
	if cause == nil {
		return nil
	}
	return fmt.Errorf("the branch tree of %q is quarantined: its recovery failed (%v); "+
		"the snapshotter tries again at every start and reap, or remove the sandbox to discard its branches: %w",
		r.key, cause, errdefs.ErrFailedPrecondition)
}

// quarantineTree records that the recovery of tree id failed, and logs it.
func (s *Branches) quarantineTree(ctx context.Context, id, key string, cause error) {
	s.quarantined.add(id, cause)
	log.G(ctx).WithError(cause).WithFields(log.Fields{"root": key, "snapshot": id}).
		Error("branch tree quarantined: its recovery failed; its branch operations are refused until a retry succeeds")
}

// retryQuarantined tries again to recover every quarantined tree, lifting
// the quarantine of those that recover (or whose root snapshot is gone).
func (s *Branches) retryQuarantined(ctx context.Context) {
	for _, id := range s.quarantined.ids() {
		key, err := s.recoverRoot(ctx, id)
		if err != nil {
			s.quarantined.add(id, err)
			log.G(ctx).WithError(err).WithField("root", key).Warn("quarantined branch tree still does not recover")
			continue
		}
		s.quarantined.lift(id)
		log.G(ctx).WithField("root", key).Info("quarantined branch tree recovered")
	}
}

// recoverRoot runs the whole recovery of root snapshot id's tree: its
// decided commits, its seals and its pending rollbacks.
func (s *Branches) recoverRoot(ctx context.Context, id string) (key string, err error) {
	var t *branch.Tree
	if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		t, err = loadTree(tx, id)
		return err
	}); err != nil {
		return "snapshot " + id, err
	}
	key = "snapshot " + id
	if t != nil {
		key = t.Root
		if err := s.recoverTree(ctx, id, t); err != nil {
			return key, err
		}
	}
	todo, err := s.pendingRollbacks(ctx, id)
	if err != nil {
		return key, err
	}
	for _, p := range todo {
		if err := s.finishPendingRollback(ctx, p); err != nil {
			return key, err
		}
	}
	return key, nil
}
