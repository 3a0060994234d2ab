//go:build linux

package snapshotter

import (
	"sync"
)

// Locks: one per branch tree, taken by every operation on the tree, with the
// wait for a seal still in flight.

// rootLocks serialises the filesystem phases of branch operations per root
// snapshot; the metadata transactions serialise the decisions themselves.
type rootLocks struct {
	mu    sync.Mutex
	locks map[string]*treeLock
}

// treeLock is one root's lock. sealing, set and read under mu, is closed
// when a fork's superblock seal, still running after the fork returned,
// ends (see sealSuperblock); until then nothing may remount the tree.
type treeLock struct {
	mu      sync.Mutex
	sealing chan struct{}
}

func (l *treeLock) awaitSeal() {
	if l.sealing != nil {
		<-l.sealing
		l.sealing = nil
	}
}

func (r *rootLocks) entry(id string) *treeLock {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.locks == nil {
		r.locks = map[string]*treeLock{}
	}
	l, ok := r.locks[id]
	if !ok {
		l = &treeLock{}
		r.locks[id] = l
	}
	return l
}

// lock takes the root's lock once a pending seal has ended.
func (r *rootLocks) lock(id string) func() {
	unlock, awaitSeal := r.lockBeforeSeal(id)
	awaitSeal()
	return unlock
}

// lockBeforeSeal takes the root's lock without waiting for a pending seal:
// the caller calls awaitSeal (with the lock held) before it reads or
// changes a mount, and may do other work first.
func (r *rootLocks) lockBeforeSeal(id string) (unlock, awaitSeal func()) {
	l := r.entry(id)
	l.mu.Lock()
	return l.mu.Unlock, l.awaitSeal
}

// sealing records a pending seal of the root, whose lock the caller holds.
func (r *rootLocks) sealing(id string, done chan struct{}) {
	r.entry(id).sealing = done
}
