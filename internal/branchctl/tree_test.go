package branchctl

import (
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// TestPrintTreeQuarantine: a sandbox whose tree the snapshotter could not
// recover shows why in branchctl tree.
func TestPrintTreeQuarantine(t *testing.T) {
	nodes := []client.BranchInfo{
		{Node: branch.Node{ID: branch.RootID, State: branch.Live}, Quarantine: "complete the commit of branch 1: disk full"},
		{Node: branch.Node{ID: "1", Parent: branch.RootID, State: branch.Committing}},
	}
	var out strings.Builder
	if err := PrintTree(&out, "sb", nodes, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "QUARANTINED: complete the commit of branch 1: disk full") {
		t.Fatalf("tree does not show the quarantine:\n%s", out.String())
	}
	out.Reset()
	nodes[0].Quarantine = ""
	if err := PrintTree(&out, "sb", nodes, time.Now()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "QUARANTINED") {
		t.Fatalf("a sound tree shown as quarantined:\n%s", out.String())
	}
}

// TestPrintTreeSealAndAge: the tree says how each branch is sealed and
// how old each is, from its own creation.
func TestPrintTreeSealAndAge(t *testing.T) {
	now := time.Now()
	nodes := []client.BranchInfo{
		{Node: branch.Node{ID: branch.RootID, State: branch.Live, Created: now.Add(-time.Hour)}, Sealed: true, Seal: "freeze"},
		{Node: branch.Node{ID: "1", Parent: branch.RootID, State: branch.Live, Created: now.Add(-2 * time.Second)}, Sealed: true, Seal: "ro"},
		{Node: branch.Node{ID: "2", Parent: "1", State: branch.Live, Created: now.Add(-time.Second)}},
	}
	var out strings.Builder
	if err := PrintTree(&out, "sb", nodes, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SEAL", "frozen", "read-only", "none", "1h0m0s", "2s", "1s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tree lacks %q:\n%s", want, out.String())
		}
	}
}

// TestPrintCheckpointsLegend: the * of checkpoint ls is explained.
func TestPrintCheckpointsLegend(t *testing.T) {
	var out strings.Builder
	list := []branch.Checkpoint{{Name: "a", Branch: branch.RootID, Head: true, Created: time.Now()}}
	if err := PrintCheckpoints(&out, "sb", list, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "a *") || !strings.Contains(out.String(), "* the branch's head") {
		t.Fatalf("no marker or legend:\n%s", out.String())
	}
}
