//go:build linux

package initdriver

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// readyInit is a waiting init of the pool, as far as taking and renaming
// it go: its cgroup is one directory (a v1 hierarchy renames it), and its
// move into the cgroup ends when joined is sent to.
func readyInit(t *testing.T, root, name string) (*Spawned, chan error) {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	joined := make(chan error, 1)
	return &Spawned{init: newProcess("", nil), cgroup: "/sb/" + name, paths: map[string]string{"pids": dir}, joined: joined}, joined
}

// A branch start that wants the name of an init another start took (and
// is renaming) must not find that name's cgroup still there: it would make
// its own in the directory being renamed away under it (CI, 2026-12-06:
// "join cgroup .../b17 to fork into it: open .../b17/tasks: no such file").
func TestPoolTakeNamedWaitsForLeaving(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	p := NewPool(&Driver{}, "/sb", 0, nil)
	s17, joined := readyInit(t, root, "b17")
	p.ready = []*Spawned{s17}

	// Branch 16's start takes the init named for 17: its move into its
	// cgroup is not done yet, so the rename waits.
	got16 := make(chan *Spawned, 1)
	go func() { got16 <- p.Take(ctx, 0, "/sb/b16") }()
	for {
		p.mu.Lock()
		taken := len(p.ready) == 0
		p.mu.Unlock()
		if taken {
			break
		}
		time.Sleep(time.Millisecond)
	}

	// Branch 17's start asks for its name meanwhile.
	got17 := make(chan *Spawned, 1)
	go func() { got17 <- p.takeNamed(ctx, "/sb/b17") }()
	select {
	case s := <-got17:
		t.Fatalf("takeNamed returned %v while the init named b17 was being renamed away", s)
	case <-time.After(50 * time.Millisecond):
	}

	joined <- nil
	if s := <-got16; s != s17 || s.cgroup != "/sb/b16" {
		t.Fatalf("branch 16 got %+v, want the init renamed to /sb/b16", s)
	}
	if s := <-got17; s != nil {
		t.Fatalf("branch 17 got %+v, want none", s)
	}
	// When branch 17's start went on, the directory was gone already.
	if _, err := os.Stat(filepath.Join(root, "b17")); !os.IsNotExist(err) {
		t.Fatalf("b17 after the rename: %v, want it gone", err)
	}
	if _, err := os.Stat(filepath.Join(root, "b16")); err != nil {
		t.Fatal(err)
	}
	if !p.reserved["/sb/b17"] || len(p.leaving) != 0 {
		t.Fatalf("reserved %v, leaving %v: want b17 reserved and nothing leaving", p.reserved, p.leaving)
	}
}

// The refill starts no init while an operation of the sandbox runs
// (refill.go): waitQuiet returns only after the operation ended, or after
// quietMax.
func TestPoolWaitQuiet(t *testing.T) {
	p := NewPool(&Driver{}, "/sb", 0, nil)
	done := p.Active()
	var ended time.Time
	returned := make(chan time.Time, 1)
	go func() {
		p.mu.Lock()
		p.waitQuiet()
		p.mu.Unlock()
		returned <- time.Now()
	}()
	time.Sleep(quietMax / 4)
	ended = time.Now()
	done()
	if at := <-returned; at.Before(ended) {
		t.Fatalf("waitQuiet returned %v before the operation ended", ended.Sub(at))
	}

	// With no operation, nothing to wait for once the gap has passed.
	time.Sleep(quietGap)
	p.mu.Lock()
	p.waitQuiet()
	p.mu.Unlock()

	// An operation that never ends holds the refill back quietMax at most,
	// and a closed pool not at all.
	_ = p.Active()
	start := time.Now()
	p.mu.Lock()
	p.waitQuiet()
	p.mu.Unlock()
	if waited := time.Since(start); waited < quietMax {
		t.Fatalf("waitQuiet returned after %v with an operation running, want quietMax (%v)", waited, quietMax)
	}
	go func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.wakeUp()
	}()
	p.mu.Lock()
	p.waitQuiet()
	p.mu.Unlock()
}
