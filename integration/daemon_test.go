//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/branchbox/branchbox/internal/daemons"
)

// dialSnapshotter connects containerd's own proxy client straight to the
// daemon, the way containerd talks to it.
func dialSnapshotter(t *testing.T, env *daemons.Env) snapshots.Snapshotter {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+env.SnapshotterAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "branch")
}

// TestDaemonSecondInstanceRefused: a second daemon on the same root exits
// with an error naming the holder, and the first keeps serving.
func TestDaemonSecondInstanceRefused(t *testing.T) {
	ctx, env := startEnv(t)
	cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "containerd-branch-snapshotter"),
		"--root", env.SnapshotterRoot, "--address", filepath.Join(env.Dir, "second.sock"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second instance: got %v, want exit status 1\n%s", err, out)
	}
	want := fmt.Sprintf("in use by process %d", env.SnapshotterPid())
	if !strings.Contains(string(out), want) {
		t.Fatalf("second instance error does not say %q:\n%s", want, out)
	}
	if _, err := os.Stat(filepath.Join(env.Dir, "second.sock")); !os.IsNotExist(err) {
		t.Fatalf("refused instance created its socket (stat: %v)", err)
	}
	sn := dialSnapshotter(t, env)
	if _, err := sn.Prepare(ctx, "still-serving", ""); err != nil {
		t.Fatalf("first instance stopped serving: %v", err)
	}
	if err := sn.Remove(ctx, "still-serving"); err != nil {
		t.Fatal(err)
	}
}

// TestDaemonFlags: bad flags are refused before anything is touched.
func TestDaemonFlags(t *testing.T) {
	requireRoot(t)
	bin := filepath.Join(daemons.BinDirFromEnv(), "containerd-branch-snapshotter")
	root := filepath.Join(t.TempDir(), "root")
	for _, args := range [][]string{
		{"--log-level", "loud", "--root", root},
		{"--root", root, "extra-arg"},
		{"--no-such-flag"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%v: got %v, want exit status 2\n%s", args, err, out)
		}
		if _, err := os.Stat(root); !os.IsNotExist(err) {
			t.Errorf("%v: root was created despite bad flags", args)
		}
	}
}

// TestDaemonSIGTERM: SIGTERM drains and exits 0, removing its socket and
// releasing the root for the next instance, which still has the snapshots.
func TestDaemonSIGTERM(t *testing.T) {
	ctx, env := startEnv(t)
	if b, err := os.ReadFile(filepath.Join(env.SnapshotterRoot, "address")); err != nil || strings.TrimSpace(string(b)) != env.SnapshotterAddress {
		t.Fatalf("address file holds %q (%v), want %s", b, err, env.SnapshotterAddress)
	}
	sn := dialSnapshotter(t, env)
	if _, err := sn.Prepare(ctx, "kept", ""); err != nil {
		t.Fatal(err)
	}
	if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
		t.Fatalf("snapshotter did not exit cleanly on SIGTERM: %v", err)
	}
	if _, err := os.Stat(env.SnapshotterAddress); !os.IsNotExist(err) {
		t.Fatalf("socket left after SIGTERM (stat: %v)", err)
	}
	if _, err := os.Stat(filepath.Join(env.SnapshotterRoot, "address")); !os.IsNotExist(err) {
		t.Fatalf("address file left after SIGTERM (stat: %v)", err)
	}
	if !strings.Contains(env.Log("snapshotter"), "draining") {
		t.Errorf("no drain logged:\n%s", env.Log("snapshotter"))
	}
	if err := env.StartSnapshotter(ctx); err != nil {
		t.Fatal(err)
	}
	sn = dialSnapshotter(t, env)
	if _, err := sn.Stat(ctx, "kept"); err != nil {
		t.Fatalf("snapshot lost across restart: %v", err)
	}
}

// TestDaemonCrashRecovery: after kill -9, a restart removes half-created
// snapshot directories and the leftovers of removals, keeps live snapshots,
// and replaces the dead instance's stale socket.
func TestDaemonCrashRecovery(t *testing.T) {
	ctx, env := startEnv(t)
	sn := dialSnapshotter(t, env)
	if _, err := sn.Prepare(ctx, "live", ""); err != nil {
		t.Fatal(err)
	}
	if err := env.StopSnapshotter(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(env.SnapshotterAddress); err != nil {
		t.Fatalf("a killed daemon cannot remove its socket, yet it is gone: %v", err)
	}
	half := filepath.Join(env.SnapshotterRoot, "snapshots", "new-2718281828")
	orphan := filepath.Join(env.SnapshotterRoot, "snapshots", "4242")
	for _, d := range []string{filepath.Join(half, "work"), filepath.Join(orphan, "fs", "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.StartSnapshotter(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{half, orphan} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s survived recovery (stat: %v)", d, err)
		}
	}
	sn = dialSnapshotter(t, env)
	if _, err := sn.Mounts(ctx, "live"); err != nil {
		t.Fatalf("live snapshot lost: %v", err)
	}
}

// TestDaemonReaper: orphaned branch state that appears while the daemon
// serves (here planted by hand) is removed on the reaper's timer, and the
// log says what went.
func TestDaemonReaper(t *testing.T) {
	ctx, env := startEnv(t)
	if err := env.StopSnapshotter(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := env.StartSnapshotterWith(ctx, []string{"--reap-interval", "100ms"}); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(env.SnapshotterRoot, "branches", "31337")
	if err := os.MkdirAll(filepath.Join(orphan, "1", "fs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(orphan); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("orphaned branch state not reaped within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(env.Log("snapshotter"), "reaped orphaned snapshot state") {
		if time.Now().After(deadline) {
			t.Fatalf("reaper did not report what it removed:\n%s", env.Log("snapshotter"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(env.Log("snapshotter"), orphan) {
		t.Fatalf("report does not name %s", orphan)
	}
	cmd := exec.Command(filepath.Join(env.BinDir, "containerd-branch-snapshotter"), "--reap-interval", "-1s")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "negative") {
		t.Fatalf("negative interval accepted: %v %s", err, out)
	}
}

// TestBadInputOverGRPC: error kinds and messages survive the wire, so
// containerd and its users see the same errdefs kinds the snapshotter made.
func TestBadInputOverGRPC(t *testing.T) {
	ctx, env := startEnv(t)
	sn := dialSnapshotter(t, env)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := sn.Prepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "base", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "child", "base"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		is   func(error) bool
		says string
	}{
		{"unknown key", func() error { _, err := sn.Stat(ctx, "nope"); return err }(), errdefs.IsNotFound, `"nope"`},
		{"active parent", func() error { _, err := sn.Prepare(ctx, "k", "child"); return err }(), errdefs.IsInvalidArgument, "commit it first"},
		{"duplicate key", func() error { _, err := sn.Prepare(ctx, "child", "base"); return err }(), errdefs.IsAlreadyExists, "already exists"},
		{"remove with children", sn.Remove(ctx, "base"), errdefs.IsFailedPrecondition, "remove its children first"},
		{"dotdot key", func() error { _, err := sn.Prepare(ctx, "../../etc/passwd", ""); return err }(), errdefs.IsInvalidArgument, `".."`},
		{"dotdot label", func() error {
			_, err := sn.Prepare(ctx, "k", "base", snapshots.WithLabels(map[string]string{"containerd.io/snapshot/../../x": "1"}))
			return err
		}(), errdefs.IsInvalidArgument, "label key"},
	} {
		err := tc.err
		if err == nil || !tc.is(err) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want the right kind saying %q", tc.name, err, tc.says)
		}
	}
	var n int
	if err := sn.Walk(ctx, func(context.Context, snapshots.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("bad calls changed the snapshot set: %d snapshots, want 2", n)
	}
	dirs, _ := filepath.Glob(filepath.Join(env.SnapshotterRoot, "snapshots", "*"))
	if len(dirs) != 2 {
		t.Fatalf("bad calls changed the snapshot directories: %v", dirs)
	}
	for _, k := range []string{"child", "base"} {
		if err := sn.Remove(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDocsConfig: the containerd configuration in docs/ is one that the
// pinned containerd accepts, with the proxy plugin and the unpack entry.
func TestDocsConfig(t *testing.T) {
	requireRoot(t)
	bin := filepath.Join(daemons.BinDirFromEnv(), "containerd")
	out, err := exec.Command(bin, "--config", "../docs/containerd-config.toml", "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd rejects docs/containerd-config.toml: %v\n%s", err, out)
	}
	for _, want := range []string{"[proxy_plugins.branch]", "address = '/run/containerd-branch-snapshotter/snapshotter.sock'", "snapshotter = 'branch'"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("config dump lacks %q:\n%s", want, out)
		}
	}
}
