package branchapi

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
)

// TestAddressOf: the socket from the branch snapshotter's root; another
// snapshotter's root of the same layout (no branch database) is the
// user's mistake, a branch snapshotter that has not written its address
// is unavailable.
func TestAddressOf(t *testing.T) {
	root := t.TempDir()
	if _, err := AddressOf(root); !errors.Is(err, ErrNotBranchRoot) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("overlayfs-like root: %v; want ErrNotBranchRoot, failed precondition", err)
	}
	if err := os.WriteFile(filepath.Join(root, branch.BranchDBFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := AddressOf(root); !errdefs.IsUnavailable(err) {
		t.Fatalf("branch root without its address: %v; want unavailable", err)
	}
	if err := os.WriteFile(filepath.Join(root, branch.AddressFile), []byte("/run/x.sock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if a, err := AddressOf(root); err != nil || a != "/run/x.sock" {
		t.Fatalf("address %q, %v", a, err)
	}
}
