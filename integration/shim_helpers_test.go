//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/branchbox/branchbox/internal/daemons"
)

const branchRuntime = "io.containerd.branch.v1"

// runtimeRoot is where containerd-shim-branch-v1 keeps container state (its
// DefaultRoot), one directory per containerd namespace.
const runtimeRoot = "/run/containerd/branch"

// shimEnv starts an env with the test image unpacked into both
// snapshotters and a client on it. Its cleanup, which runs before the
// env's own teardown, force-removes whatever containers a failed test left
// and then the runtime's state directory for the env's namespace.
func shimEnv(t *testing.T) (context.Context, *daemons.Env, *containerd.Client) {
	t.Helper()
	return shimEnvWith(t, daemons.Config{})
}

// shimEnvWith is shimEnv with a harness configuration.
func shimEnvWith(t *testing.T, cfg daemons.Config) (context.Context, *daemons.Env, *containerd.Client) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(daemons.BinDirFromEnv(), "containerd-shim-branch-v1")); err != nil {
		t.Fatalf("containerd-shim-branch-v1 not built (make binaries): %v", err)
	}
	ctx, env := startEnvWith(t, cfg)
	importImage(t, ctx, env, "overlayfs")
	importImage(t, ctx, env, "branch")
	client, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx := namespaces.WithNamespace(context.Background(), env.Namespace)
		cs, _ := client.Containers(cctx)
		for _, c := range cs {
			if task, err := c.Task(cctx, nil); err == nil {
				_ = task.Kill(cctx, 9, containerd.WithKillAll)
				_, _ = task.Delete(cctx, containerd.WithProcessKill)
			}
			_ = c.Delete(cctx, containerd.WithSnapshotCleanup)
		}
		client.Close()
		killLeftovers(t, env.Namespace)
		if err := os.Remove(filepath.Join(runtimeRoot, env.Namespace)); err != nil && !errors.Is(err, os.ErrNotExist) {
			left, _ := os.ReadDir(filepath.Join(runtimeRoot, env.Namespace))
			var names []string
			for _, e := range left {
				names = append(names, e.Name())
			}
			t.Errorf("runtime state left: %v (%v)", err, names)
			_ = os.RemoveAll(filepath.Join(runtimeRoot, env.Namespace))
		}
	})
	return namespaces.WithNamespace(ctx, env.Namespace), env, client
}

// ctrExit runs ctr and returns its stdout, stderr and exit status.
func ctrExit(ctx context.Context, env *daemons.Env, args ...string) (string, string, int) {
	return ctrExitIn(ctx, env, "", args...)
}

// ctrExitIn is ctrExit with stdin as ctr's standard input.
func ctrExitIn(ctx context.Context, env *daemons.Env, stdin string, args ...string) (string, string, int) {
	full := append([]string{"--address", env.Address, "--namespace", env.Namespace}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "ctr"), full...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
		stderr.WriteString(err.Error())
	}
	return stdout.String(), stderr.String(), code
}

// taskStatus is the STATUS column of `ctr tasks ls` for id, "" if absent.
func taskStatus(t *testing.T, ctx context.Context, env *daemons.Env, id string) string {
	t.Helper()
	out, err := env.Ctr(ctx, "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			return f[2]
		}
	}
	return ""
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out after %s waiting for %s", timeout, what)
}

// hostProc is a process seen from the host: pid plus start time, so that a
// reused pid is not mistaken for a survivor.
type hostProc struct {
	pid   int
	start string
	cmd   string
}

func procStart(pid int) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" {
		return "", false // zombies are dead; their parent reaps them
	}
	return f[19], true
}

// hostProcsWith counts the live processes of container id (in namespace)
// whose command line contains cmd.
func hostProcsWith(namespace, id, cmd string) int {
	n := 0
	for _, p := range containerHostProcs(namespace, id, 0) {
		if strings.Contains(p.cmd, cmd) {
			n++
		}
	}
	return n
}

// containerHostProcs lists, from /proc, every live process of the host whose
// cgroup (on any hierarchy) is the container's /<namespace>/<id> or below
// it, or whose PID namespace is the one of pid (the container's init).
func containerHostProcs(namespace, id string, initPid int) []hostProc {
	cg := "/" + namespace + "/" + id
	pidns := ""
	if initPid > 0 {
		pidns, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", initPid))
	}
	entries, _ := os.ReadDir("/proc")
	var out []hostProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		start, ok := procStart(pid)
		if !ok {
			continue
		}
		mine := false
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				parts := strings.SplitN(line, ":", 3)
				if len(parts) == 3 && (parts[2] == cg || strings.HasPrefix(parts[2], cg+"/")) {
					mine = true
				}
			}
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && pidns != "" && ns == pidns {
			mine = true
		}
		if mine {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			out = append(out, hostProc{pid: pid, start: start, cmd: strings.ReplaceAll(string(cmd), "\x00", " ")})
		}
	}
	return out
}

// survivors returns the processes of procs still alive (same pid and start).
func survivors(procs []hostProc) []hostProc {
	var out []hostProc
	for _, p := range procs {
		if start, ok := procStart(p.pid); ok && start == p.start {
			out = append(out, p)
		}
	}
	return out
}

// containerCgroupDirs lists the container's cgroup directories on every
// hierarchy.
func containerCgroupDirs(namespace, id string) []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", namespace, id))
	if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", namespace, id)); err == nil && fi.IsDir() {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", namespace, id))
	}
	return dirs
}

// assertContainerGone checks from the host that nothing of the container is
// left: no process of procs, none in its cgroup, no cgroup directory, no
// rootfs mount and no runtime state.
func assertContainerGone(t *testing.T, env *daemons.Env, id string, procs []hostProc) {
	t.Helper()
	var left []hostProc
	waitUntil(t, "container processes to go", 10*time.Second, func() bool {
		left = append(survivors(procs), containerHostProcs(env.Namespace, id, 0)...)
		return len(left) == 0
	})
	if dirs := containerCgroupDirs(env.Namespace, id); len(dirs) != 0 {
		t.Errorf("cgroups of %s left: %v", id, dirs)
	}
	bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, id)
	if m, _ := daemons.MountsUnder(bundle); len(m) != 0 {
		t.Errorf("mounts of %s left: %v", id, m)
	}
	if _, err := os.Stat(filepath.Join(runtimeRoot, env.Namespace, id)); err == nil {
		t.Errorf("runtime state of %s left", id)
	}
}

// killLeftovers SIGKILLs, by pid, processes still in the env's container
// cgroups (thawing frozen ones first, as cgroup v1 requires), so that a
// runtime bug a test caught does not leave containers running on the
// machine. Finding any is an error.
func killLeftovers(t *testing.T, namespace string) {
	t.Helper()
	held, err := daemons.KillCgroups(namespace)
	if err != nil {
		t.Error(err)
	}
	left := map[string]bool{}
	for _, d := range held {
		if _, rel, ok := strings.Cut(d, "/"+namespace+"/"); ok {
			left[rel] = true
		}
	}
	if len(left) > 0 {
		t.Errorf("processes left in the cgroups of containers %v (killed)", left)
	}
}

// cgroupV2 says the host runs cgroup v2 alone (no v1 controllers).
func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// cgroupFile is the path of a file of controller ctrl of the cgroup cg:
// on the controller's v1 hierarchy, or on cgroup v2.
func cgroupFile(ctrl, cg, file string) string {
	if cgroupV2() {
		return filepath.Join("/sys/fs/cgroup", cg, file)
	}
	return filepath.Join("/sys/fs/cgroup", ctrl, cg, file)
}

// moveIntoCgroup puts pid into the cgroup cg on every hierarchy where it
// exists, as a process of the host would be put into a branch's cgroup
// from outside its PID namespace.
func moveIntoCgroup(t *testing.T, pid int, cg string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cg))
	if d := filepath.Join("/sys/fs/cgroup", cg); cgroupV2() {
		dirs = []string{d}
	}
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			t.Fatalf("move process %d into cgroup %s: %v", pid, d, err)
		}
	}
}

// assertDomainCgroup checks that the cgroup cg has the memory controller:
// on v1 a directory on the memory hierarchy; on v2 a domain cgroup (not a
// threaded one, which has no memory or io controller) with memory in its
// cgroup.controllers.
func assertDomainCgroup(t *testing.T, what, cg string) {
	t.Helper()
	if !cgroupV2() {
		if !isDirPath(filepath.Join("/sys/fs/cgroup/memory", cg)) {
			t.Errorf("%s: no memory cgroup %s", what, cg)
		}
		return
	}
	typ, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, "cgroup.type"))
	ctrls, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, "cgroup.controllers"))
	if strings.TrimSpace(string(typ)) != "domain" || !strings.Contains(" "+string(ctrls)+" ", " memory ") {
		t.Errorf("%s: cgroup %s is %q with controllers %q; want a domain cgroup with memory", what, cg, strings.TrimSpace(string(typ)), strings.TrimSpace(string(ctrls)))
	}
}

// cgroupProcs lists the processes of the cgroup cg and the cgroups below
// it, on the pids hierarchy (cgroup v1) or cgroup v2.
func cgroupProcs(t *testing.T, cg string) []string {
	t.Helper()
	var pids []string
	_ = filepath.WalkDir(filepath.Dir(cgroupFile("pids", cg, "cgroup.procs")), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			pids = append(pids, strings.Fields(string(b))...)
		}
		return nil
	})
	return pids
}
