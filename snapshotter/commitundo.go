//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/log"

	"github.com/branchbox/branchbox/snapshotter/apply"
)

// A commit that was decided but whose apply failed (a disk that filled
// meanwhile, an I/O error) is undone: the apply recorded in a journal the
// pre-image of every path of the parent's upper it changed, and the
// journal puts them back. The branch stays committing, so that calling
// commit again applies it anew, and aborting it abandons it (see docs/commit.md).
//
//	<root>/journal/<root snapshot id>-<branch id>-<attempt>-<n>
//	    a link to an entry of the parent's upper that a commit replaced

const journalDirName = "journal"

// newJournal returns an empty journal for the commit of branch id into the
// branch whose upper is parentUpper.
func (s *Branches) newJournal(rootID, id, parentUpper string) *apply.Journal {
	prefix := fmt.Sprintf("%s-%s-%d-", rootID, id, s.journalSeq.Add(1))
	return apply.NewJournal(parentUpper, filepath.Join(s.root, journalDirName), prefix)
}

// restoreParent undoes what the journal recorded in the parent's upper.
// live is where the parent is mounted ("" if nowhere): its overlay then
// must forget the dentries and inodes it cached of the old entries, or it
// keeps showing what the apply made. Processes that hold a changed file or
// directory open keep that handle.
func (s *Branches) restoreParent(ctx context.Context, j *apply.Journal, live string) error {
	if !j.Changed() {
		return nil
	}
	if err := j.Restore(ctx); err != nil {
		return err
	}
	if live != "" {
		if err := dropDentries(); err != nil {
			return fmt.Errorf("make the mount at %s forget what the apply changed: %w", live, err)
		}
	}
	return nil
}

// discardJournal removes a journal's links in the background, as discard
// does a layer: unlinking them is where the entries the apply replaced are
// freed, which a commit need not wait for.
func (s *Branches) discardJournal(ctx context.Context, j *apply.Journal) {
	s.trash.Go(func() {
		if err := j.Discard(); err != nil {
			log.G(ctx).WithError(err).Warn("remove a commit's journal; the next start does")
		}
	})
}

// dropDentries makes the kernel drop unused dentries and inodes, the
// known way to make a live overlay look its upper directory up afresh
// after it was changed underneath. It costs the whole machine's dentry
// cache, which is why only a failed commit uses it.
func dropDentries() error {
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
}

// removeJournals removes what commits left at a crash (at start): a
// commit decided before it is completed by recovery, which needs none.
// The directory stays, for the commits to come.
func (s *Branches) removeJournals(ctx context.Context) error {
	dir := filepath.Join(s.root, journalDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove leftover commit journal: %w", err)
		}
		log.G(ctx).WithField("journal", e.Name()).Info("removed leftover commit journal")
	}
	return nil
}

// undoneCommits remembers the committing branches whose parent this
// process knows to be as before the commit: a failed apply it undid, or a
// failure before the apply changed anything. Only those may be abandoned
// by an abort; one seen first after a restart (when recovery failed) may
// hold part of its apply.
type undoneCommits struct {
	mu    sync.Mutex
	clean map[string]bool
}

func undoneKey(rootID, id string) string { return rootID + "/" + id }

func (u *undoneCommits) set(rootID, id string, clean bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.clean == nil {
		u.clean = map[string]bool{}
	}
	if clean {
		u.clean[undoneKey(rootID, id)] = true
	} else {
		delete(u.clean, undoneKey(rootID, id))
	}
}

func (u *undoneCommits) isClean(rootID, id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.clean[undoneKey(rootID, id)]
}
