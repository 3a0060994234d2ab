//go:build linux

package apply

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/fstest"
)

// dropDentries makes every overlay forget the dentries and inodes it
// cached, as the snapshotter does after a restore.
func dropDentries(t testing.TB) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
}

// TestJournalRestoresLiveMount: a parent overlay with changes of its own
// stays mounted; a branch's upper (made by the kernel over it) is applied
// through that mount and cut short after a random number of entries (or
// not at all); Restore plus a dentry drop must give back, through the same
// live mount, exactly the tree it showed before. BRANCHBOX_APPLY_SEED
// replays one round; BRANCHBOX_JOURNAL_ROUNDS sets how many run (60).
func TestJournalRestoresLiveMount(t *testing.T) {
	requireRoot(t)
	first := uint64(time.Now().UnixNano())
	rounds := envInt("BRANCHBOX_JOURNAL_ROUNDS", 60)
	if s := envInt("BRANCHBOX_APPLY_SEED", -1); s >= 0 {
		first, rounds = uint64(s), 1
	}
	cut, whole := 0, 0
	for i := range rounds {
		seed := first + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0))
			dir := t.TempDir()
			L, P, U := filepath.Join(dir, "L"), filepath.Join(dir, "P"), filepath.Join(dir, "U")
			must(t, os.Mkdir(L, 0o755))
			randBase(r)(t, L)
			parent := filepath.Join(dir, "parent")
			mountOverlay(t, parent, P, filepath.Join(dir, "PW"), L)
			for range 1 + r.IntN(20) {
				randOp(r, parent, listTree(t, parent))
			}
			// The branch stacks on the parent's upper, as a fork does.
			unmount := mountOverlay(t, filepath.Join(dir, "M"), U, filepath.Join(dir, "W"), P, L)
			for range 1 + r.IntN(40) {
				randOp(r, filepath.Join(dir, "M"), listTree(t, filepath.Join(dir, "M")))
			}
			unmount()
			before := snapshotTree(t, parent)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stopAt := r.IntN(12) // entries opened before the apply is cut
			opened := 0
			must(t, os.Mkdir(filepath.Join(dir, "journal"), 0o700))
			j := NewJournal(P, filepath.Join(dir, "journal"), "j-")
			defer j.Close()
			_, err := Apply(ctx, U, parent, WithTargetUpper(P), WithJournal(j), func(o *options) {
				o.beforeOpen = func(string, string) {
					if opened++; opened > stopAt {
						cancel()
					}
				}
			})
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("Apply: %v", err)
			}
			if err != nil {
				cut++
			} else {
				whole++
			}
			if err := j.Restore(context.Background()); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if err := j.Discard(); err != nil {
				t.Fatalf("Discard: %v", err)
			}
			if left, _ := os.ReadDir(filepath.Join(dir, "journal")); len(left) != 0 {
				t.Fatalf("links left after Discard: %v", left)
			}
			dropDentries(t)
			if diffs := fstest.DiffTrees(before, snapshotTree(t, parent)); len(diffs) > 0 {
				t.Fatalf("after restore (apply cut: %v) the live mount differs from before: %v", err != nil, diffs)
			}
			checkNoTemps(t, parent)
		})
		if !ok {
			t.Fatalf("round failed; replay with BRANCHBOX_APPLY_SEED=%d", seed)
		}
	}
	t.Logf("first seed %d: %d applies cut short, %d whole, all restored", first, cut, whole)
	if rounds >= 20 && (cut == 0 || whole == 0) {
		t.Fatalf("rounds did not reach both a cut and a whole apply (%d, %d)", cut, whole)
	}
}
