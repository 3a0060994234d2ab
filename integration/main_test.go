//go:build linux

package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("integration tests run real daemons and mounts and must run as root (make test does)")
	}
}

// startEnv starts a private containerd and snapshotter for one test and
// registers their teardown, which also checks that nothing leaked.
func startEnv(t testing.TB) (context.Context, *daemons.Env) {
	t.Helper()
	return startEnvWith(t, daemons.Config{})
}

// startEnvWith is startEnv with a harness configuration (the CRI tests
// turn the CRI plugins on with it).
func startEnvWith(t testing.TB, cfg daemons.Config) (context.Context, *daemons.Env) {
	t.Helper()
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	env, err := daemons.Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer cancel()
		if t.Failed() {
			t.Logf("containerd log:\n%s", lastLines(env.Log("containerd"), 40))
			t.Logf("snapshotter log:\n%s", lastLines(env.Log("snapshotter"), 400))
		}
		dir := env.Dir
		shims := env.ShimPids()
		if cg := env.ContainerCgroups(); len(cg) > 0 {
			t.Errorf("container cgroups still present at teardown (removed): %v", cg)
		}
		if err := env.Stop(context.Background()); err != nil {
			t.Errorf("stop env: %v", err)
		}
		if len(shims) > 0 {
			t.Errorf("shims still running at teardown (killed): %v", shims)
		}
		if m, _ := daemons.MountsUnder(dir); len(m) > 0 {
			t.Errorf("mounts left under %s: %v", dir, m)
		}
	})
	return ctx, env
}

// importImage builds the busybox test image and imports it, unpacked into
// the given snapshotter.
func importImage(t testing.TB, ctx context.Context, env *daemons.Env, snapshotter string) {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "busybox.tar")
	if err := ociimage.WriteBusyboxImageFile(archive); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "images", "import", "--snapshotter", snapshotter, archive); err != nil {
		t.Fatal(err)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
