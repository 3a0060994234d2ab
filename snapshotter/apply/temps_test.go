//go:build linux

package apply

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestStaleTempRemoval: temporaries a killed Apply left in the directories
// of upper go when the same upper is applied again with the option, and
// stay without it (they could be the target's own names).
func TestStaleTempRemoval(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("must run as root (make test does)")
	}
	upper, target := t.TempDir(), t.TempDir()
	for _, p := range []string{filepath.Join(upper, "d", "f"), filepath.Join(target, "d", "keep")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	staleFile := filepath.Join(target, "d", TempPrefix+"4242-7")
	staleDir := filepath.Join(target, TempPrefix+"4242-8")
	if err := os.WriteFile(staleFile, []byte("half written"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(staleDir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(context.Background(), upper, target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(staleFile); err != nil {
		t.Fatalf("without the option a temporary-looking name was removed: %v", err)
	}
	if _, err := Apply(context.Background(), upper, target, WithStaleTempRemoval()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{staleFile, staleDir} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived: %v", p, err)
		}
	}
	for _, p := range []string{filepath.Join(target, "d", "f"), filepath.Join(target, "d", "keep")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s lost: %v", p, err)
		}
	}
}
