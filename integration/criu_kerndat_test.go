//go:build linux

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCriuKerndatCache: the runtime sees that CRIU finds its cache of the
// kernel's features (shim/ocirt/kerndat.go), which saves a probe of about
// 25 ms in every dump and restore: a criu.kdat.tmp left by a killed CRIU
// (which made every later CRIU give up saving the cache) is removed, and
// where /run is no tmpfs the cache is made there. The proof is CRIU's own
// log: it loads the cache.
func TestCriuKerndatCache(t *testing.T) {
	bin := daemons.BinDirFromEnv()
	criu := filepath.Join(bin, "criu")
	if _, err := os.Stat(criu); err != nil {
		t.Fatalf("criu is built into bin/ by make binaries: %v", err)
	}
	const run = "/run"
	stale := filepath.Join(run, "criu.kdat.tmp")
	for _, f := range []string{"criu.kdat", "criu.kdat.boot-id"} {
		if err := os.Remove(filepath.Join(run, f)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-10 * time.Minute)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(stale) })

	// Any checkpoint or restore prepares CRIU first, even one of a
	// container that does not exist.
	root := t.TempDir()
	out, err := exec.Command(filepath.Join(bin, "containerd-shim-branch-v1-runtime"), "--root", root,
		"checkpoint", "--image-path", filepath.Join(root, "img"), "no-such-container").CombinedOutput()
	if err == nil {
		t.Fatalf("checkpoint of a container that does not exist succeeded: %s", out)
	}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale %s is still there (%v); runtime said: %s", stale, err, out)
	}
	// Where /run is a tmpfs CRIU saves the cache itself, at its first run.
	logDir := t.TempDir()
	for i := range 2 {
		log := filepath.Join(logDir, "check.log")
		cmd := exec.Command(criu, "check", "-v4", "-o", log)
		cmd.Dir = logDir
		_ = cmd.Run()
		data, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "Loaded kdat cache from /run/criu.kdat") {
			return
		}
		if i == 1 {
			t.Fatalf("criu did not load its kerndat cache; its log:\n%s", lastLines(string(data), 30))
		}
	}
}
