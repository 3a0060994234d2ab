//go:build linux

package snapshotter

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCheckpointReapedInFlight: a reaper that runs while a checkpoint's
// layer is in place but not yet recorded (the removal of another
// snapshot, containerd's Cleanup after a collection, the daemon's timer)
// leaves the layer alone, and the checkpoint can be rolled back to. Before,
// the reaper took the layer for an orphan and removed it, and the rollback
// failed with "load manifest: open .../manifest: no such file or
// directory" (seen in a fresh-clone run of the TypeScript SDK's test,
// whose previous sandbox's removal raced the next one's checkpoint).
func TestCheckpointReapedInFlight(t *testing.T) {
	ctx, s := newTest(t)
	sb := newSandbox(t, ctx, s, "ns/1/sandbox")
	m, err := s.Mounts(ctx, sb.key)
	if err != nil {
		t.Fatal(err)
	}
	dir := mountAt(t, m)
	writeFile(t, filepath.Join(dir, "v"), "1")
	inPlace, release := make(chan struct{}), make(chan struct{})
	s.faultHook = func(p string) {
		if p == FaultCheckpointInPlace {
			close(inPlace)
			<-release
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Checkpoint(ctx, sb.ctx(""), "one")
		done <- err
	}()
	<-inPlace
	if _, err := s.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.faultHook = nil
	writeFile(t, filepath.Join(dir, "v"), "2")
	if err := s.Rollback(ctx, sb.ctx(""), "one"); err != nil {
		t.Fatalf("rollback to a checkpoint a reaper ran beside: %v", err)
	}
	if got := readFile(t, filepath.Join(dir, "v")); got != "1" {
		t.Fatalf("after the rollback /v is %q, want 1", got)
	}
	// What a crash there leaves (the layer in place, no record) goes at
	// the next start.
	layer := filepath.Join(s.checkpointBase(s.mustID(t, ctx, sb.key)), "7")
	if err := os.MkdirAll(filepath.Join(layer, "fs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.removeCheckpointTemps(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(layer); !os.IsNotExist(err) {
		t.Fatalf("an unrecorded layer survives the start's clean-up: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.checkpointBase(s.mustID(t, ctx, sb.key)), "1", "manifest")); err != nil {
		t.Fatalf("the recorded layer after the start's clean-up: %v", err)
	}
}
