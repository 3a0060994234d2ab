package branch

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

var t0 = time.Unix(1000, 0)

func TestForkSealsAndCommitInvalidatesSiblings(t *testing.T) {
	tr := NewTree("sandbox", t0)
	kids, err := tr.Fork(RootID, 3, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(kids, []string{"1", "2", "3"}) {
		t.Fatalf("fork ids %v", kids)
	}
	if !tr.Sealed(RootID) {
		t.Fatal("root with live children is not sealed")
	}
	grand, err := tr.Fork("3", 2, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.Ancestors(grand[0]); !reflect.DeepEqual(got, []string{"3", RootID}) {
		t.Fatalf("ancestors %v", got)
	}
	plan, err := tr.BeginCommit("2", t0)
	if err != nil {
		t.Fatal(err)
	}
	want := CommitPlan{Winner: "2", Parent: RootID, Epoch: 1, Invalidated: []string{"1", "3", "4", "5"}}
	if !reflect.DeepEqual(plan, want) {
		t.Fatalf("plan %+v, want %+v", plan, want)
	}
	for _, id := range []string{"1", "3", "4"} {
		_, err := tr.Get(id)
		var se *StaleError
		if !errors.As(err, &se) || se.Winner != "2" || se.WinnerEpoch != 1 || !errdefs.IsAborted(err) {
			t.Fatalf("%s: got %v, want stale naming winner 2 epoch 1", id, err)
		}
		if !strings.Contains(err.Error(), "branch 2 committed first (epoch 1)") {
			t.Errorf("message %q", err)
		}
	}
	if _, err := tr.BeginCommit("1", t0); !errdefs.IsAborted(err) {
		t.Fatalf("second committer: got %v, want stale", err)
	}
	if !tr.Sealed(RootID) {
		t.Fatal("root unsealed while the winner is still committing")
	}
	if got := tr.Committing(); !reflect.DeepEqual(got, []string{"2"}) {
		t.Fatalf("committing %v", got)
	}
	if err := tr.FinishCommit("2", t0); err != nil {
		t.Fatal(err)
	}
	if tr.Sealed(RootID) {
		t.Fatal("root still sealed after the commit finished")
	}
	if _, err := tr.Get("2"); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "committed into the root (epoch 1)") {
		t.Fatalf("committed branch: %v", err)
	}
	if len(tr.Layered()) != 0 {
		t.Fatalf("layers left: %v", tr.Layered())
	}
	// The root lives on and forks again from its new epoch.
	again, err := tr.Fork(RootID, 1, t0)
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.Nodes[again[0]]; n.ForkEpoch != 1 || n.ID != "6" {
		t.Fatalf("new fork %+v", n)
	}
}

func TestOnlyLeavesCommit(t *testing.T) {
	tr := NewTree("s", t0)
	kids, _ := tr.Fork(RootID, 1, t0)
	tr.Fork(kids[0], 2, t0)
	_, err := tr.BeginCommit(kids[0], t0)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "2 live children (2, 3)") {
		t.Fatalf("got %v", err)
	}
	if tr.Nodes[kids[0]].State != Live || tr.Nodes[RootID].Epoch != 0 {
		t.Fatal("refused commit changed the tree")
	}
}

func TestNestedCommitThenUp(t *testing.T) {
	tr := NewTree("s", t0)
	a, _ := tr.Fork(RootID, 2, t0)
	b, _ := tr.Fork(a[0], 2, t0)
	p, err := tr.BeginCommit(b[1], t0)
	if err != nil || p.Parent != a[0] || p.Epoch != 1 || !reflect.DeepEqual(p.Invalidated, []string{b[0]}) {
		t.Fatalf("inner commit %+v %v", p, err)
	}
	tr.FinishCommit(b[1], t0)
	p, err = tr.BeginCommit(a[0], t0)
	if err != nil || p.Parent != RootID || p.Epoch != 1 || !reflect.DeepEqual(p.Invalidated, []string{a[1]}) {
		t.Fatalf("outer commit %+v %v", p, err)
	}
}

func TestAbort(t *testing.T) {
	tr := NewTree("s", t0)
	a, _ := tr.Fork(RootID, 2, t0)
	b, _ := tr.Fork(a[0], 2, t0)
	gone, err := tr.Abort(a[0], t0)
	if err != nil || !reflect.DeepEqual(gone, []string{a[0], b[0], b[1]}) {
		t.Fatalf("abort %v %v", gone, err)
	}
	if !tr.Sealed(RootID) {
		t.Fatal("root unsealed while a sibling lives")
	}
	if _, err := tr.Get(b[0]); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("aborted descendant: %v", err)
	}
	if _, err := tr.Abort(a[1], t0); err != nil {
		t.Fatal(err)
	}
	if tr.Sealed(RootID) {
		t.Fatal("root sealed after its last child ended")
	}
	if _, err := tr.Abort(RootID, t0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("abort root: %v", err)
	}
	if _, err := tr.Abort("99", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("abort unknown: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	tr := NewTree("s", t0)
	if _, err := tr.Fork(RootID, 0, t0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("fork 0: %v", err)
	}
	if _, err := tr.Fork("7", 1, t0); !errdefs.IsNotFound(err) {
		t.Fatalf("fork unknown: %v", err)
	}
	if _, err := tr.BeginCommit(RootID, t0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("commit root: %v", err)
	}
}

// TestFirstCommitWinsExhaustive: whatever order n siblings try to commit in,
// exactly the first succeeds and all others are stale naming it.
func TestFirstCommitWinsExhaustive(t *testing.T) {
	for n := 2; n <= 64; n *= 2 {
		for first := 0; first < n; first += n / 2 {
			tr := NewTree("s", t0)
			kids, _ := tr.Fork(RootID, n, t0)
			order := append(append([]string{}, kids[first:]...), kids[:first]...)
			wins := 0
			for _, id := range order {
				if _, err := tr.BeginCommit(id, t0); err == nil {
					wins++
				} else if se := (*StaleError)(nil); !errors.As(err, &se) || se.Winner != kids[first] {
					t.Fatalf("n=%d: %s: %v", n, id, err)
				}
			}
			if wins != 1 {
				t.Fatalf("n=%d: %d winners", n, wins)
			}
		}
	}
}

func TestEndedNodesLeaveTheTree(t *testing.T) {
	tr := NewTree("s", t0)
	kids, _ := tr.Fork(RootID, 2, t0)
	tr.Abort(kids[0], t0)
	ended := tr.TakeEnded()
	if len(ended) != 1 || ended[0].ID != kids[0] || ended[0].State != Aborted {
		t.Fatalf("ended %+v", ended)
	}
	if _, ok := tr.Nodes[kids[0]]; ok {
		t.Fatal("aborted node still among the live ones")
	}
	// Without tombstones the tree no longer knows it.
	if _, err := tr.Get(kids[0]); !errdefs.IsNotFound(err) || strings.Contains(err.Error(), "aborted") {
		t.Fatalf("without tombstones: %v", err)
	}
	tr.SetTombstones(func(id string) *Node {
		if id == ended[0].ID {
			return ended[0]
		}
		return nil
	})
	if _, err := tr.Get(kids[0]); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("with tombstones: %v", err)
	}
	if len(tr.TakeEnded()) != 0 {
		t.Fatal("TakeEnded returned nodes twice")
	}
}

// TestAbandonCommit: a committing branch whose apply was undone ends
// aborted; its siblings stay stale, the parent keeps its new epoch and is
// unsealed, forks go on; only a committing branch can be abandoned.
func TestAbandonCommit(t *testing.T) {
	tr := NewTree("sb", t0)
	kids, err := tr.Fork(RootID, 2, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.AbandonCommit(kids[0], t0); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("abandon of a live branch: %v", err)
	}
	if _, err := tr.BeginCommit(kids[0], t0); err != nil {
		t.Fatal(err)
	}
	if err := tr.AbandonCommit(kids[0], t0); err != nil {
		t.Fatal(err)
	}
	if n, ok := tr.Ended(kids[0]); !ok || n.State != Aborted {
		t.Fatalf("abandoned branch: %+v %v", n, ok)
	}
	if n, ok := tr.Ended(kids[1]); !ok || n.State != Stale || n.Winner != kids[0] {
		t.Fatalf("sibling: %+v %v", n, ok)
	}
	if _, ok := tr.Ended(RootID); ok {
		t.Fatal("the live root reported ended")
	}
	if tr.Sealed(RootID) || tr.Nodes[RootID].Epoch != 1 {
		t.Fatalf("root after the abandon: sealed %v, epoch %d", tr.Sealed(RootID), tr.Nodes[RootID].Epoch)
	}
	if _, err := tr.Fork(RootID, 1, t0); err != nil {
		t.Fatal(err)
	}
}
