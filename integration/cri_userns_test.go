//go:build linux

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// The pod user namespace the userns tests ask for, as a kubelet does for
// hostUsers: false: container ids 0-65535 on host ids usernsHost onwards.
const (
	usernsHost = 65536 * 3
	usernsSize = 65536
)

// usernsOptions is the CRI's userns_options of a pod-mode user namespace.
func usernsOptions() map[string]any {
	m := []map[string]any{{"host_id": usernsHost, "container_id": 0, "length": usernsSize}}
	return map[string]any{"mode": nsPod, "uids": m, "gids": m}
}

// runUsernsPod runs a pod in its own user namespace on handler, with a
// container that runs sleep with the given CRI mounts, and returns the
// pod's and the container's ids.
func (c *criTest) runUsernsPod(name, handler string, mounts []map[string]any) (string, string) {
	c.t.Helper()
	nsOpts := map[string]any{"network": nsPod, "pid": nsContainer, "ipc": nsPod, "userns_options": usernsOptions()}
	cfg := c.writeJSON(name+"-pod.json", map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "default", "uid": name + "-uid", "attempt": 0},
		"log_directory": filepath.Join(c.dir, "logs", name),
		"linux": map[string]any{
			"cgroup_parent":    "/" + c.env.Namespace,
			"security_context": map[string]any{"namespace_options": nsOpts},
		},
	})
	out, err := c.env.Crictl(c.ctx, "runp", "--runtime", handler, cfg)
	if err != nil {
		c.t.Fatalf("run pod on %s: %v\n%s", handler, err, out)
	}
	pod := lastLine(out)
	c.ids = append(c.ids, pod)
	ccfg := c.writeJSON(name+"-container.json", map[string]any{
		"metadata": map[string]any{"name": "app", "attempt": 0},
		"image":    map[string]any{"image": criAppImage},
		"command":  []string{"/bin/sh", "-c", "exec sleep 1000"},
		"log_path": "app.log",
		"mounts":   mounts,
		"linux": map[string]any{
			"security_context": map[string]any{"namespace_options": nsOpts},
		},
	})
	out, err = c.env.Crictl(c.ctx, "create", pod, ccfg, cfg)
	if err != nil {
		c.t.Fatalf("create container on %s: %v\n%s", handler, err, out)
	}
	ctr := lastLine(out)
	c.ids = append(c.ids, ctr)
	if out, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
		c.t.Fatalf("start container on %s: %v\n%s", handler, err, out)
	}
	return pod, ctr
}

// usernsProbe runs in a container or a branch and prints what the tests
// compare: the process's ids and mapping, the owners of image files, and
// whether writes to the host directory at /host succeed.
const usernsProbe = `id -u; id -g; cat /proc/self/uid_map /proc/self/gid_map
stat -c '%u:%g %n' / /bin/busybox /etc
try() {
	if r=$( { eval "$2"; } 2>&1 ); then echo "$1: written"; else
		case "$r" in
		*"Permission denied"*) echo "$1: EACCES" ;;
		*"Operation not permitted"*) echo "$1: EPERM" ;;
		*"Read-only file system"*) echo "$1: EROFS" ;;
		*) echo "$1: $r" ;;
		esac
	fi
}
try host-file 'echo x >> /host/host-file'
try host-dir 'touch /host/new'
try host-chown 'chown 0:0 /host/host-file'
try owned-file 'echo x >> /host/owned-file'`

// usernsHostDir makes the host directory the userns tests bind-mount at
// /host: owned by host root (0755) with host-file (root's, 0644), which
// host uid usernsHost cannot write, and owned-file (usernsHost's, the
// container root's, 0644). It is searchable by all, as a kubelet's pod
// volumes are.
func usernsHostDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bbx-userns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"host-file", "owned-file"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(dir, "owned-file"), usernsHost, usernsHost); err != nil {
		t.Fatal(err)
	}
	return dir
}

// writableAs says whether host uid and gid, outside any user namespace,
// could open path for writing (a child process with those ids tries).
func writableAs(t *testing.T, path string, uid, gid int) bool {
	t.Helper()
	p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", `exec 3>>"$0"`, path}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return st.Success()
}

// TestCRIUserns runs a pod with its own user namespace (what a kubelet
// asks for hostUsers: false) on the runc handler (upstream runc, as
// Debian's lacks id-mapped mounts) and on branch, and checks that the
// branch handler reports the feature, that its container sees what runc's
// does, that a branch of it runs in the same mapping with the same view,
// that root in the branch cannot write a host-owned file that its host uid
// could not write either while it can write its own, and that a commit of
// the branch's files lands owned by the mapped root on the host.
func TestCRIUserns(t *testing.T) {
	c := criEnvWith(t, daemons.CRIConfig{RuncBinary: upstreamRunc(t)})
	feats, out := c.handlerFeatures()
	// What the kubelet checks before it runs a pod with hostUsers: false.
	if !feats["branch"].UserNamespaces || !feats["runc"].UserNamespaces {
		t.Fatalf("user namespaces by handler %v, want true for branch as for runc; crictl info:\n%s", feats, out)
	}

	hostDir := usernsHostDir(t)
	hostFile := filepath.Join(hostDir, "host-file")
	// What the mapped root is outside the user namespace: neither it may
	// write host-file, nor make a file in the directory; it may write
	// owned-file.
	if writableAs(t, hostFile, usernsHost, usernsHost) || writableAs(t, filepath.Join(hostDir, "new"), usernsHost, usernsHost) {
		t.Fatalf("host uid %d can write %s or make a file in it: the test's premise fails", usernsHost, hostDir)
	}
	if !writableAs(t, filepath.Join(hostDir, "owned-file"), usernsHost, usernsHost) {
		t.Fatalf("host uid %d cannot write its own file", usernsHost)
	}
	mounts := []map[string]any{{"container_path": "/host", "host_path": hostDir}}

	mapLine := fmt.Sprintf("0 %d %d", usernsHost, usernsSize)
	want := strings.Join([]string{
		"0", "0", mapLine, mapLine,
		"0:0 /", "0:0 /bin/busybox", "0:0 /etc",
		"host-file: EACCES", "host-dir: EACCES", "host-chown: EPERM", "owned-file: written",
	}, "\n")
	probe := func(who string, run func(args ...string) (string, error)) {
		t.Helper()
		out, err := run("sh", "-c", usernsProbe)
		if err != nil {
			t.Fatalf("%s: probe: %v\n%s", who, err, out)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			got = append(got, strings.Join(strings.Fields(l), " "))
		}
		// Each refused write was refused for want of permission (EACCES),
		// as it is outside the user namespace, and not for another reason;
		// root's chown of a file whose owner it does not map, with EPERM.
		if g := strings.Join(got, "\n"); g != want {
			t.Fatalf("%s sees:\n%s\nwant:\n%s", who, g, want)
		}
	}
	crictlRun := func(ctr string) func(args ...string) (string, error) {
		return func(args ...string) (string, error) {
			return c.env.Crictl(c.ctx, append([]string{"exec", "-s", ctr}, args...)...)
		}
	}

	_, runcCtr := c.runUsernsPod("userns-runc", "runc", mounts)
	probe("the runc handler's container", crictlRun(runcCtr))
	_, ctr := c.runUsernsPod("userns-branch", "branch", mounts)
	probe("the branch handler's container", crictlRun(ctr))

	// The snapshotter id-mapped the image's layer rather than containerd
	// copying and chowning the image into a remapped snapshot: every
	// copy of busybox under its root is the image's own, root's.
	copies, _ := filepath.Glob(filepath.Join(c.env.SnapshotterRoot, "snapshots", "*", "fs", "bin", "busybox"))
	if len(copies) == 0 {
		t.Fatal("no image layer holds /bin/busybox")
	}
	for _, p := range copies {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 0 || st.Gid != 0 {
			t.Fatalf("%s is owned by %d:%d: the image was chowned, not id-mapped", p, st.Uid, st.Gid)
		}
	}

	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	kids, err := sc.Fork(c.ctx, client.ForkOptions{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	runIn := func(id string) func(args ...string) (string, error) {
		return func(args ...string) (string, error) {
			var out client.Output
			st, err := sc.Run(c.ctx, id, client.ExecOptions{Args: args, Stdout: &out, Stderr: &out})
			if err == nil && st.Code != 0 {
				err = fmt.Errorf("exit status %d", st.Code)
			}
			return out.String(), err
		}
	}
	// The sandbox is sealed while it has branches: its root's writes to
	// its rootfs fail with EROFS, as any sandbox's.
	if out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "sh", "-c", "echo x > /sealed"); err == nil || !strings.Contains(out+err.Error(), "Read-only file system") {
		t.Fatalf("write to the sealed sandbox's rootfs: %v\n%s", err, out)
	}
	// The branches join the pod's user namespace, as its containers do.
	podUserns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", c.pidOf("inspect", ctr)))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		probe("branch "+k.ID, runIn(k.ID))
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", k.InitPid)); err != nil || ns != podUserns {
			t.Fatalf("branch %s's init is in user namespace %q (%v), the pod's is %s", k.ID, ns, err, podUserns)
		}
	}
	// A memory fork is refused before the dump stops anything: the
	// container joins the pod's IPC and UTS namespaces, which CRIU cannot
	// join from the user namespace it restores into.
	if _, err := sc.ForkResult(c.ctx, client.ForkOptions{Count: 1, WithMemory: true}); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "a pod's") {
		t.Fatalf("memory fork of a pod's container in a user namespace: %v, want not implemented", err)
	}
	// A nested branch keeps the mapping too.
	nested, err := sc.Fork(c.ctx, client.ForkOptions{Parent: kids[0].ID, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	probe("nested branch "+nested[0].ID, runIn(nested[0].ID))

	// Files root makes in a branch are the mapped root's on the host once
	// committed; a file of the image it changes keeps its owner.
	if out, err := runIn(nested[0].ID)("sh", "-c", "echo hi > /made && mkdir /madedir && chown 1000:1000 /madedir && echo x >> /etc/passwd"); err != nil {
		t.Fatalf("write in the nested branch: %v\n%s", err, out)
	}
	if _, err := sc.Commit(c.ctx, nested[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Commit(c.ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	out, err = c.env.Crictl(c.ctx, "exec", "-s", ctr, "stat", "-c", "%u:%g %n", "/made", "/madedir", "/etc/passwd")
	if got := strings.Join(strings.Fields(out), " "); err != nil || got != "0:0 /made 1000:1000 /madedir 0:0 /etc/passwd" {
		t.Fatalf("the container sees the committed files as %q (%v)", out, err)
	}
	pid := c.pidOf("inspect", ctr)
	for name, want := range map[string]int{"made": usernsHost, "madedir": usernsHost + 1000, "etc/passwd": usernsHost} {
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/root/%s", pid, name), &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != want || int(st.Gid) != want {
			t.Errorf("/%s is %d:%d on the host after the commit, want %d:%d", name, st.Uid, st.Gid, want, want)
		}
	}
	// The sandbox, writable again, still runs in its mapping.
	probe("the branch handler's container after the commits", crictlRun(ctr))
	if b, err := os.ReadFile(hostFile); err != nil || string(b) != "host\n" {
		t.Fatalf("host-file holds %q (%v) after the containers and branches tried to write it", b, err)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "new")); !os.IsNotExist(err) {
		t.Fatalf("a file was made in the host's directory: %v", err)
	}
}

// upstreamRunc is runc at the version of the libcontainer the shim links
// (bin/runc-upstream): Debian's runc 1.1 has no id-mapped mounts, so a
// runc handler on it cannot run what the branch handler can.
func upstreamRunc(t *testing.T) string {
	t.Helper()
	runcBin := filepath.Join(daemons.BinDirFromEnv(), "runc-upstream")
	if _, err := os.Stat(runcBin); err != nil {
		t.Fatalf("runc-upstream not built (make binaries): %v", err)
	}
	return runcBin
}
