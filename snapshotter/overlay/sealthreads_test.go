//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A seal thread remounts the superblock read-only, is reused for the next
// seal, and ends (its OS thread too) when the pool closes; a pool that has
// closed ends threads handed back to it.
func TestSealThreads(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	_, target, _ := testOverlay(t)
	live := Live{Target: target, Options: "rw,relatime"}

	var p SealThreads
	t.Cleanup(p.Close) // on failure; closing twice is harmless
	first, err := p.take()
	if err != nil {
		t.Fatal(err)
	}
	p.put(first)
	for round := range 2 {
		run := p.remount(ctx, live)
		for !run.issued.Load() || !ProbeRefused(target) {
			yieldCPU()
		}
		run.settle()
		if err := <-run.result; err != nil {
			t.Fatalf("round %d: remount: %v", round, err)
		}
		run.release()
		if err := os.WriteFile(filepath.Join(target, "f"), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Fatalf("round %d: write to the sealed mount: %v, want EROFS", round, err)
		}
		if err := Remount(live, false); err != nil {
			t.Fatal(err)
		}
	}
	if len(p.idle) != 1 || p.idle[0] != first {
		t.Fatalf("idle threads after two seals: %d, want the first one reused", len(p.idle))
	}

	extra, err := newSealThread()
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.put(extra) // after close: ended, not kept
	if len(p.idle) != 0 {
		t.Fatalf("closed pool keeps %d threads", len(p.idle))
	}
	for _, th := range []*sealThread{first, extra} {
		select {
		case <-th.ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("seal thread %d still serves after the pool closed", th.tid)
		}
		if th.tid == os.Getpid() {
			continue // the main thread is parked, never ended
		}
		task := fmt.Sprintf("/proc/self/task/%d", th.tid)
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(task); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("seal thread %d still runs after the pool closed", th.tid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
