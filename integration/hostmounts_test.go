//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/ociimage"
	"github.com/branchbox/branchbox/shim/initdriver"
)

// TestHostUnmountNotPinned: a mount the node unmounts is gone, and its
// filesystem freed, whether the node's mounts are private (no systemd as
// PID 1: containers in containers, CI machines, this one) or shared
// (systemd). Before, the inits a sandbox starts ahead of its forks were
// cloned into a mount namespace of their own at once: where the node's
// mounts are private, a copy of every mount of the node at that moment,
// held for as long as the init waited, which kept other containers'
// rootfs and the layers of aborted branches (their space: TestFullDisk
// failed so in CI) alive after the node unmounted them. A mount made
// before the sandbox's pool, seen by an init waiting in it, is unmounted
// on the host: no process of the sandbox still has it, and a fork after
// it still works. Where the node's root mount is shared, the waiting init
// has its namespace made already (a copy whose mounts are the node's
// peers), so that the fork does not wait for it; elsewhere it is in the
// node's until the fork. The test runs again, whole, in a mount
// namespace of the other kind (unshare --propagation).
func TestHostUnmountNotPinned(t *testing.T) {
	hostUnmountNotPinned(t, initdriver.RootShared())
	againWithOtherPropagation(t)
}

// againWithOtherPropagation runs the test t again, whole, in a mount
// namespace whose mounts propagate the other way (shared where this one's
// root mount is private, private where it is shared), unless it is that
// run.
func againWithOtherPropagation(t *testing.T) {
	if os.Getenv("BRANCHBOX_TEST_PROPAGATION") != "" {
		return
	}
	shared := initdriver.RootShared()
	other := map[bool]string{true: "private", false: "shared"}[shared]
	t.Run(other, func(t *testing.T) {
		name := strings.SplitN(t.Name(), "/", 2)[0]
		cmd := exec.Command("unshare", "--mount", "--propagation", other, os.Args[0],
			"-test.run", "^"+name+"$", "-test.v", "-test.count", "1")
		cmd.Env = append(os.Environ(), "BRANCHBOX_TEST_PROPAGATION="+other)
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("the root mount is shared: "+strconv.FormatBool(!shared))) {
			t.Fatalf("the test in a namespace whose mounts are %s: %v\n%s", other, err, out)
		}
	})
}

// TestVolumeSeesHostMounts: under a volume (a bind mount of a host
// directory), a branch sees what its sandbox sees. runc makes a
// container's mounts slaves of the node's (its default root propagation,
// rslave), so that where the node's mounts are shared (systemd) a mount
// the node makes below the volume's directory once the container runs
// appears in it, and where they are private it does not; a branch
// forked before that mount must follow its sandbox either way. A branch
// forked after it sees it, as a container started then would.
func TestVolumeSeesHostMounts(t *testing.T) {
	volumeSeesHostMounts(t, initdriver.RootShared())
	againWithOtherPropagation(t)
}

func volumeSeesHostMounts(t *testing.T, shared bool) {
	vol := t.TempDir()
	ctx, env, _ := shimEnv(t)
	if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch",
		"--mount", "type=bind,src="+vol+",dst=/v,options=rbind:rw", ociimage.ImageRef, "sb", "sleep", "100000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb") })
	sc := sandboxClient(t, ctx, env, "sb")
	before := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	sub := filepath.Join(vol, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(fmt.Sprintf("bbx-vol-%d", time.Now().UnixNano()), sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(sub, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(sub, "f"), []byte("mounted by the node\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inSandbox, _ := execIn(ctx, env, "sb", "sh", "-c", "cat /v/sub/f 2>/dev/null; true")
	t.Logf("the root mount is shared: %v; the sandbox reads %q below its volume", shared, inSandbox)
	if want := map[bool]string{true: "mounted by the node\n", false: ""}[shared]; inSandbox != want {
		t.Fatalf("the sandbox (runc's way) reads %q below its volume, want %q", inSandbox, want)
	}
	if got := mustRun(t, ctx, sc, before.ID, "sh", "-c", "cat /v/sub/f 2>/dev/null; true"); got != inSandbox {
		t.Fatalf("branch %s, forked before the node's mount, reads %q below its volume; its sandbox reads %q", before.ID, got, inSandbox)
	}
	after := fork(t, ctx, sc, client.ForkOptions{Count: 1, Parent: before.ID})[0]
	if got := mustRun(t, ctx, sc, after.ID, "cat", "/v/sub/f"); got != "mounted by the node\n" {
		t.Fatalf("branch %s, forked after the node's mount, reads %q below its volume", after.ID, got)
	}
}

func hostUnmountNotPinned(t *testing.T, shared bool) {
	t.Logf("the root mount is shared: %v", shared)
	dir := t.TempDir()
	source := fmt.Sprintf("bbx-pin-%d", time.Now().UnixNano())
	if err := unix.Mount(source, dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	}()
	ctx, env, sc := sandboxCtxEnv(t)
	cg := "/" + env.Namespace + "/sb"
	// The client's dial starts the sandbox's pool: wait for an init of it,
	// which sees the mount, in the sandbox's cgroup and outside its
	// container; where the root mount is shared, until it has made its
	// mount namespace (once it is sent its early part).
	var waiting string
	waitFor(t, func() bool {
		waiting = seeing(t, cg, source)
		return waiting != "" && (!shared || mountNS(waiting) != mountNS("self"))
	})
	own := mountNS(waiting) != mountNS("self")
	t.Logf("init %s waits with the mount in view, in a mount namespace of its own: %v", waiting, own)
	if own != shared {
		t.Fatalf("init %s waiting ahead of a fork has a mount namespace of its own: %v; want %v where the root mount's shared is %v", waiting, own, shared, shared)
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if pid := seeing(t, cg, source); pid != "" {
		b, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		t.Fatalf("process %s (%q) of the sandbox still has the mount the host unmounted", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
	}
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	if got := mustRun(t, ctx, sc, kids[0].ID, "cat", "/state"); got != "before\n" {
		t.Fatalf("the branch forked after the unmount reads %q", got)
	}
	if got := mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "grep -c "+source+" /proc/self/mountinfo; true"); got != "0\n" {
		t.Fatalf("the branch has the host's mount: %s", got)
	}
}

// mountNS is the mount namespace of process pid ("self" for this one),
// "" if it is gone.
func mountNS(pid string) string {
	ns, _ := os.Readlink(filepath.Join("/proc", pid, "ns", "mnt"))
	return ns
}

// seeing returns a process in cgroup cg (or below) whose mount namespace
// has a mount of source, or "".
func seeing(t *testing.T, cg, source string) string {
	for _, pid := range cgroupProcs(t, cg) {
		b, err := os.ReadFile(filepath.Join("/proc", pid, "mountinfo"))
		if err == nil && bytes.Contains(b, []byte(" "+source+" ")) {
			return pid
		}
	}
	return ""
}
