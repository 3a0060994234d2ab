package main

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
	nodes := []client.ContextInfo{
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
