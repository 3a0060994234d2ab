//go:build linux

package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestContainerOnBranchSnapshotter runs a container with `ctr run
// --snapshotter branch` on a locally built image, checks that what it writes
// lands in its branch snapshot, and that removing container and image leaves
// no snapshot directory and no mount behind.
func TestContainerOnBranchSnapshotter(t *testing.T) {
	ctx, env := startEnv(t)
	importImage(t, ctx, env, "branch")

	out, err := env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "sha256:") || !strings.Contains(out, "Committed") {
		t.Fatalf("image not unpacked into the branch snapshotter:\n%s", out)
	}

	// 512 KiB of data and a marker, then stay alive so the rootfs stays mounted.
	script := "dd if=/dev/zero of=/payload bs=1024 count=512 2>/dev/null && echo written-by-container > /hello.txt && exec sleep 600"
	if _, err := env.Ctr(ctx, "run", "-d", "--snapshotter", "branch", ociimage.ImageRef, "c1", "sh", "-c", script); err != nil {
		t.Fatal(err)
	}
	var got string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got, err = env.Ctr(ctx, "tasks", "exec", "--exec-id", "cat"+strconv.FormatInt(time.Now().UnixNano(), 36), "c1", "cat", "/hello.txt")
		if err == nil && strings.TrimSpace(got) == "written-by-container" {
			break
		}
	}
	if strings.TrimSpace(got) != "written-by-container" {
		t.Fatalf("container did not see its own file: %q %v", got, err)
	}

	// The harness can name the running shim's socket (it removes the
	// sockets of shims it has to kill).
	shims := env.ShimPids()
	if len(shims) != 1 {
		t.Fatalf("want one shim, have %v", shims)
	}
	found := false
	for _, s := range env.ShimSockets(shims[0]) {
		if fi, err := os.Stat(s); err == nil && fi.Mode().Type() == os.ModeSocket {
			found = true
		}
	}
	if !found {
		t.Fatalf("none of %v is the running shim's socket", env.ShimSockets(shims[0]))
	}

	// The file is in the container's upper layer in the snapshotter's root.
	uppers, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "snapshots", "*", "fs", "hello.txt"))
	if len(uppers) != 1 {
		t.Fatalf("want the file in exactly one upper layer, found %v", uppers)
	}
	if b, _ := os.ReadFile(uppers[0]); strings.TrimSpace(string(b)) != "written-by-container" {
		t.Fatalf("upper layer holds %q", b)
	}
	// And it is mounted: the task's rootfs is an overlay over that upper.
	mounts, _ := daemons.MountsUnder(env.ContainerdState)
	if len(mounts) == 0 {
		t.Fatal("no rootfs mount for the running task")
	}

	out, err = env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "usage", "c1")
	if err != nil {
		t.Fatal(err)
	}
	if size := usageBytes(t, out, "c1"); size < 512*1024 {
		t.Fatalf("usage of c1 is %d bytes, want at least the 512 KiB written:\n%s", size, out)
	}

	if _, err := env.Ctr(ctx, "tasks", "kill", "-s", "SIGKILL", "c1"); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, env, "c1")
	if _, err := env.Ctr(ctx, "tasks", "delete", "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "containers", "delete", "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "images", "rm", "--sync", ociimage.ImageRef); err != nil {
		t.Fatal(err)
	}

	var left []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		left, _ = filepath.Glob(filepath.Join(env.SnapshotterRoot, "snapshots", "*"))
		if len(left) == 0 {
			break
		}
	}
	if len(left) != 0 {
		t.Fatalf("snapshot directories left after removing container and image: %v", left)
	}
	if out, _ := env.Ctr(ctx, "snapshots", "--snapshotter", "branch", "ls"); strings.Contains(out, "sha256:") {
		t.Fatalf("snapshots still listed:\n%s", out)
	}
	if m, _ := daemons.MountsUnder(env.Dir); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
}

func waitStopped(t *testing.T, env *daemons.Env, id string) {
	t.Helper()
	ctx := t.Context()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out, err := env.Ctr(ctx, "tasks", "ls")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == id && f[2] == "STOPPED" {
				return
			}
		}
	}
	t.Fatalf("task %s did not stop", id)
}

// usageBytes parses `ctr snapshots usage KEY` output ("KEY SIZE INODES",
// SIZE in human units such as 516.0 KiB).
func usageBytes(t *testing.T, out, key string) int64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != key {
			continue
		}
		n, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatalf("usage line %q: %v", line, err)
		}
		mult := map[string]float64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[f[2]]
		if mult == 0 {
			t.Fatalf("usage line %q: unknown unit", line)
		}
		return int64(n * mult)
	}
	t.Fatalf("no usage line for %s in:\n%s", key, out)
	return 0
}
