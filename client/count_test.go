package client

import (
	"testing"

	"github.com/containerd/errdefs"
)

// TestCheckCount: counts that would wrap on the wire are refused, not
// truncated (4294967297 used to fork one branch).
func TestCheckCount(t *testing.T) {
	for n, ok := range map[int]bool{1: true, 1024: true, 0: false, -1: false, 1 << 32: false, 1<<32 + 1: false} {
		if err := checkCount(n); ok != (err == nil) || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("count %d: %v", n, err)
		}
	}
}
