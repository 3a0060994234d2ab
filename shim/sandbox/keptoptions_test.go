//go:build linux

package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
)

// TestDeadShimOptions: the cleanup after a dead shim finds the runtime's
// root in options.json, and in the kept copy when options.json was left
// empty by a shim killed while the task service rewrote it.
func TestDeadShimOptions(t *testing.T) {
	ctx := context.Background()
	bundle := t.TempDir()
	if opts, err := DeadShimOptions(ctx, bundle); err != nil || opts != nil {
		t.Fatalf("no options at all: %v %v, want none (the defaults)", opts, err)
	}
	want := &options.Options{Root: "/run/elsewhere", BinaryName: "/bin/shim"}
	if err := runc.WriteOptions(bundle, want); err != nil {
		t.Fatal(err)
	}
	if err := KeepOptions(bundle, want); err != nil {
		t.Fatal(err)
	}
	if opts, err := DeadShimOptions(ctx, bundle); err != nil || opts.Root != want.Root {
		t.Fatalf("options.json: %v %v", opts, err)
	}
	// A shim killed between the truncate and the write.
	if err := os.WriteFile(filepath.Join(bundle, "options.json"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err := DeadShimOptions(ctx, bundle); err != nil || opts.Root != want.Root {
		t.Fatalf("options.json empty: %v %v, want the kept copy's root", opts, err)
	}
	if _, err := os.Stat(filepath.Join(bundle, keptOptionsFile+".tmp")); !os.IsNotExist(err) {
		t.Fatalf("temporary file of the kept copy left: %v", err)
	}
	os.Remove(filepath.Join(bundle, keptOptionsFile))
	if _, err := DeadShimOptions(ctx, bundle); err == nil {
		t.Fatal("options.json empty and no kept copy: no error")
	}
}
