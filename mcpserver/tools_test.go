//go:build linux

package mcpserver

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// TestActionable: a tool error names its kind and the next call.
func TestActionable(t *testing.T) {
	for _, c := range []struct {
		err        error
		kind, next string
	}{
		{&branch.StaleError{Branch: "2", Winner: "1"}, "stale", "call fork"},
		{fmt.Errorf("no branch 9: %w", errdefs.ErrNotFound), "not-found", "call tree"},
		{fmt.Errorf("/a: read-only file system: %w", errdefs.ErrFailedPrecondition), "failed-precondition", "write in a branch"},
		{fmt.Errorf("too many: %w", errdefs.ErrResourceExhausted), "resource-exhausted", "abort branches"},
		{fmt.Errorf("other: %w", errdefs.ErrPermissionDenied), "permission-denied", "scoped"},
	} {
		got := actionable(c.err).Error()
		if !strings.Contains(got, "kind "+c.kind) || !strings.Contains(got, c.next) {
			t.Errorf("%v: %q, want kind %s and %q", c.err, got, c.kind, c.next)
		}
	}
	if actionable(nil) != nil {
		t.Error("actionable(nil) is not nil")
	}
}

func TestCapped(t *testing.T) {
	c := &capped{max: 5}
	for _, s := range []string{"ab", "cd", "ef", "gh"} {
		if n, err := c.Write([]byte(s)); n != 2 || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	if c.String() != "abcde" || !c.truncated {
		t.Fatalf("%q %v", c.String(), c.truncated)
	}
}
