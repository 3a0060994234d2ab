//go:build linux

package layer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestDiff: changes in many directories at once (the scan reads them in
// parallel) come back in walk order, parents before children, each kind
// right, and the manifest lists every entry.
func TestDiff(t *testing.T) {
	ctx := context.Background()
	upper := t.TempDir()
	makeUpper(t, upper, 40, 300) // 12,000 files: large directories too
	time.Sleep(2 * recentMargin())
	_, m, err := Diff(ctx, upper, Manifest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 40+40*300 {
		t.Fatalf("manifest of %d entries, want %d", len(m), 40+40*300)
	}
	var want []Change
	for d := range 40 {
		dir := filepath.Join(upper, fmt.Sprintf("d%03d", d))
		switch d % 4 {
		case 0: // a file rewritten in place
			if err := os.WriteFile(filepath.Join(dir, "f00007"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			want = append(want, Change{Path: fmt.Sprintf("d%03d/f00007", d), Kind: Modified})
		case 1: // a file removed
			if err := os.Remove(filepath.Join(dir, "f00011")); err != nil {
				t.Fatal(err)
			}
		case 2: // a new directory with a file
			if err := os.MkdirAll(filepath.Join(dir, "new"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "new", "x"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	changes, cur, err := Diff(ctx, upper, m)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for i, c := range changes {
		seen[c.Path] = i
	}
	for d := range 40 {
		dir := fmt.Sprintf("d%03d", d)
		switch d % 4 {
		case 1:
			if i, ok := seen[dir+"/f00011"]; !ok || changes[i].Kind != Deleted {
				t.Errorf("%s/f00011 removed: not reported deleted (%v)", dir, changes)
			}
		case 2:
			i, ok := seen[dir+"/new"]
			if !ok || changes[i].Kind != Modified {
				t.Fatalf("%s/new: want a new directory, listed as modified, in %v", dir, changes)
			}
			j, ok := seen[dir+"/new/x"]
			if !ok || changes[j].Kind != Added || j < i {
				t.Errorf("%s/new/x: want added after its directory, in %v", dir, changes)
			}
		}
	}
	for _, w := range want {
		if i, ok := seen[w.Path]; !ok || changes[i] != w {
			t.Errorf("want %v in %v", w, changes)
		}
	}
	// The directories whose entries changed are modified too (their ctime).
	for _, c := range changes {
		if c.Kind == Modified && !slices.Contains([]string{"f00007", "new"}, filepath.Base(c.Path)) && filepath.Dir(c.Path) != "." {
			t.Errorf("unexpected change %v", c)
		}
	}
	if _, ok := cur["d002/new/x"]; !ok || len(cur) != len(m)-10+20 {
		t.Errorf("manifest of %d entries after the changes, want %d with d002/new/x", len(cur), len(m)-10+20)
	}
	// A cancelled diff says so.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := Diff(cctx, upper, m); !errors.Is(err, context.Canceled) {
		t.Errorf("diff with a cancelled context: %v", err)
	}
}
