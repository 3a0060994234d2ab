//go:build linux

package snapshotter

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/branch"
)

// forkCrashingBeforeSeal runs a fork of c that stops dead between its
// record and its seal (FaultForkCommitted), as a SIGKILL there would.
func forkCrashingBeforeSeal(t *testing.T, ctx context.Context, s *Snapshotter, c branch.Ref, n int) {
	t.Helper()
	fired := make(chan bool, 1)
	s.faultHook = func(p string) {
		if p == FaultForkCommitted {
			fired <- true
			runtime.Goexit()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.Fork(ctx, c, n)
	}()
	<-done
	s.faultHook = nil
	select {
	case <-fired:
	default:
		t.Fatalf("fork of %s did not reach %s", c, FaultForkCommitted)
	}
}

// TestRecoverForkCutBeforeSeal: a snapshotter killed between a fork's
// record and its seal, whose parent has a file open for writing at the
// restart (so the seal never held: the fork would have failed, naming the
// writer). Recovery cannot reseal the parent; the fork's branches were
// never handed out and hold nothing, so they are discarded as the fork's
// own undo would have, instead of quarantining the tree (which refused
// even the aborts of the shim's reconciliation, and left the sandbox's
// memory fork stuck). Branches that hold something are kept, the tree
// quarantined: nothing is lost.
func TestRecoverForkCutBeforeSeal(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for _, used := range []bool{false, true} {
		name := "unused"
		if used {
			name = "used"
		}
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			s, err := New(ctx, root)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { s.Close() }()
			sb := newSandbox(t, ctx, s, "sb")
			rm, err := s.Mounts(ctx, sb.key)
			if err != nil {
				t.Fatal(err)
			}
			parent := mountAt(t, rm)
			forkCrashingBeforeSeal(t, ctx, s, sb.ctx(""), 2)
			sbID := s.mustID(t, ctx, sb.key)
			kids, _ := filepath.Glob(filepath.Join(root, "branches", sbID, "[0-9]*"))
			if len(kids) != 2 {
				t.Fatalf("the cut fork's branch directories: %v", kids)
			}
			if used {
				writeFile(t, filepath.Join(kids[0], "fs", "work"), "a branch's\n")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			w, err := os.OpenFile(filepath.Join(parent, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()

			if s, err = New(ctx, root); err != nil {
				t.Fatal(err)
			}
			ti, err := s.Tree(ctx, sb.root)
			if err != nil {
				t.Fatal(err)
			}
			live := 0
			for _, n := range ti.Nodes {
				if n.ID != branch.RootID && n.State == branch.Live {
					live++
				}
			}
			if used {
				if live != 2 || !strings.Contains(ti.Quarantine, "read-only") {
					t.Fatalf("a cut fork whose branch holds data: %d live, quarantine %q; want both kept, quarantined", live, ti.Quarantine)
				}
				if got := readFile(t, filepath.Join(kids[0], "fs", "work")); got != "a branch's\n" {
					t.Fatalf("the branch's data: %q", got)
				}
				return
			}
			if live != 0 || ti.Quarantine != "" {
				t.Fatalf("a cut fork's unused branches: %d live, quarantine %q; want them discarded, no quarantine", live, ti.Quarantine)
			}
			for _, k := range kids {
				if _, err := os.Stat(k); !os.IsNotExist(err) {
					t.Fatalf("a discarded branch's directory %s: %v", k, err)
				}
			}
			// The parent is writable and forks again.
			if _, err := w.WriteString("on\n"); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(parent, "new"), "x\n")
			w.Close()
			if _, err := s.Fork(ctx, sb.ctx(""), 1); err != nil {
				t.Fatalf("fork after the recovery: %v", err)
			}
		})
	}
}
