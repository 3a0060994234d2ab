//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// TestHostless: an answer to a caller inside a sandbox names the
// snapshotter's root in words, not by its host path, and keeps its kind
// and its details.
func TestHostless(t *testing.T) {
	const root = "/var/lib/containerd-branch-snapshotter"
	upper := root + "/snapshots/12/fs"
	full := toTTRPC(fmt.Errorf("checkpoint sb as %q: no room for its layer under %s (no space left on device); free space or inodes there, or delete checkpoints: %w", "c1", root, errdefs.ErrResourceExhausted))
	got := branch.FromGRPC(hostlessIn(full, upper))
	if strings.Contains(got.Error(), root) || !strings.Contains(got.Error(), "under the snapshotter's root (no space") || !errdefs.IsResourceExhausted(got) {
		t.Errorf("full disk: %v", got)
	}
	bound := toTTRPC(&branch.CheckpointBoundError{Count: 3, MaxCheckpoints: 3, Message: "checkpoint \"c4\" ... under " + root + " ..."})
	var be *branch.CheckpointBoundError
	if got := branch.FromGRPC(hostlessIn(bound, upper)); !errors.As(got, &be) || be.Count != 3 || strings.Contains(got.Error(), root) {
		t.Errorf("a bound's details: %#v (%v)", got, got)
	}
	other := toTTRPC(fmt.Errorf("branch 3 of sb: %w", errdefs.ErrNotFound))
	if got := hostlessIn(other, upper); got != other {
		t.Errorf("an answer without the root changed: %v", got)
	}
	if got := hostlessIn(full, "/elsewhere"); got != full {
		t.Errorf("an upper not of the snapshotter: %v", got)
	}
}
