package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestContextsSystemdCgroup runs sandboxes under the systemd cgroup
// driver, their cgroupsPath "system.slice:bbx:NAME" as nerdctl
// --cgroup-manager systemd and ctr --cgroup write it (ctr passes no
// SystemdCgroup option here: the shim keys the driver on the path's form).
// The sandbox is the delegated scope bbx-NAME.scope; its branches' cgroups
// are below it, with their own limits and OOM count; seal freeze, abort,
// commit and the sandbox's delete leave no cgroup and no unit behind; and
// the runtime path (the branch runtime as runc's CLI) works for branches
// too. It needs systemd as PID 1 with its D-Bus (hack/cgroupv2-vm.sh's
// guest has both).
func TestContextsSystemdCgroup(t *testing.T) {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		t.Skip("systemd is not PID 1 here (/run/systemd/system is missing): the systemd cgroup driver needs it and its D-Bus; hack/cgroupv2-vm.sh runs this test in a guest that has them")
	}
	ctx, env, _ := shimEnv(t)

	// The branch init's path, on cgroup v2: limits, OOM, freeze, abort,
	// commit, delete.
	scope, sc := systemdSandbox(t, ctx, env, "1", "--memory-limit", strconv.Itoa(512<<20))
	if !cgroupV2() {
		// Enough on v1 that the sandbox runs in its scope on every
		// hierarchy; the files below are v2's.
		t.Log("cgroup v1: the limit files checked are v2's; checking the cycle only")
	}
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2, Memory: 32 << 20, CPUs: 0.5, Pids: 20})
	a, b := kids[0], kids[1]
	for _, k := range kids {
		if !strings.HasPrefix(k.Cgroup, scope+"/") {
			t.Fatalf("branch %s cgroup %q; want one below the sandbox's scope %s", k.ID, k.Cgroup, scope)
		}
	}
	if cgroupV2() {
		for file, want := range map[string]string{
			cgroupFile("", a.Cgroup, "memory.max"):  strconv.Itoa(32 << 20),
			cgroupFile("", a.Cgroup, "cpu.max"):     "50000 100000",
			cgroupFile("", a.Cgroup, "pids.max"):    "20",
			cgroupFile("", a.Cgroup, "cgroup.type"): "domain",
		} {
			got, err := os.ReadFile(file)
			if err != nil || strings.TrimSpace(string(got)) != want {
				t.Errorf("%s = %q (%v); want %s", file, got, err, want)
			}
		}
	}
	_, st, err := runErr(ctx, sc, a.ID, "sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived")
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 137 || !st.OOMKilled {
		t.Fatalf("memory hog in a 32 MiB branch: %+v; want killed by the OOM killer", st)
	}
	nodes, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if oom := n.ID == a.ID; n.OOMKilled != oom {
			t.Errorf("tree: branch %s OOM-killed %v; want %v (only the branch that ran out)", n.ID, n.OOMKilled, oom)
		}
	}
	// The OOM was the branch's: the sandbox and its scope live on.
	if got := mustRun(t, ctx, sc, b.ID, "echo", "alive"); got != "alive\n" {
		t.Fatalf("sibling after the OOM: %q", got)
	}
	if _, err := execIn(ctx, env, "sb", "true"); err != nil {
		t.Fatalf("sandbox after a branch's OOM: %v", err)
	}
	assertUnit(t, scope, true)

	if _, err := sc.Abort(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, a, nil)
	mustRun(t, ctx, sc, b.ID, "sh", "-c", "echo systemd > /state")
	if _, err := sc.Commit(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, b, nil)
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "systemd\n" {
		t.Fatalf("sandbox after commit: %q %v", out, err)
	}

	// Seal freeze: the sandbox's own processes frozen in the scope's
	// .sealed leaf while it has a branch, thawed after.
	pid := sandboxInitPid(t, ctx, sc)
	f := fork(t, ctx, sc, client.ForkOptions{Count: 1, Seal: "freeze"})[0]
	if cg := procCgroupV2(t, pid); cgroupV2() && (cg != scope+"/.sealed" || !frozenCgroup(cg)) {
		t.Errorf("sandbox init with a --seal freeze branch in cgroup %q (frozen %v); want %s/.sealed, frozen", cg, frozenCgroup(cg), scope)
	}
	mustRun(t, ctx, sc, f.ID, "true")
	if _, err := sc.Abort(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, f, nil)
	if cg := procCgroupV2(t, pid); cgroupV2() && (strings.HasSuffix(cg, "/.sealed") || frozenCgroup(cg)) {
		t.Errorf("sandbox init after its last branch ended in cgroup %q (frozen %v); want thawed", cg, frozenCgroup(cg))
	}
	// A branch left live is ended with the sandbox.
	live := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	removeContainer(t, env, "sb")
	assertBranchGone(t, env, live, nil)
	assertScopeGone(t, scope)

	// The runtime path (a spec the branch init does not take): the branch
	// runtime makes the branch cgroups below the scope as runc's CLI.
	scope, sc = systemdSandbox(t, ctx, env, "2", "--seccomp", "--cap-add", "CAP_SYS_PTRACE")
	kids = fork(t, ctx, sc, client.ForkOptions{Count: 2, Memory: 64 << 20, Pids: 30})
	for _, k := range kids {
		if !strings.HasPrefix(k.Cgroup, scope+"/") {
			t.Fatalf("branch %s started by the runtime: cgroup %q; want one below the sandbox's scope %s", k.ID, k.Cgroup, scope)
		}
		assertDomainCgroup(t, "branch "+k.ID+" started by the runtime", k.Cgroup)
		if cgroupV2() {
			if got, err := os.ReadFile(cgroupFile("", k.Cgroup, "pids.max")); err != nil || strings.TrimSpace(string(got)) != "30" {
				t.Errorf("branch %s started by the runtime: pids.max %q (%v); want 30", k.ID, got, err)
			}
		}
	}
	if got := mustRun(t, ctx, sc, kids[0].ID, "cat", "/proc/1/comm"); strings.HasPrefix(got, "brinit") {
		t.Fatalf("branch of a CAP_SYS_PTRACE sandbox runs the branch init (%q); want the runtime's", got)
	}
	mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", "echo runtime > /state")
	if _, err := sc.Commit(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, kids[0], nil)
	assertBranchGone(t, env, kids[1], nil)
	if out, err := execIn(ctx, env, "sb", "cat", "/state"); err != nil || out != "runtime\n" {
		t.Fatalf("sandbox after commit: %q %v", out, err)
	}
	removeContainer(t, env, "sb")
	assertScopeGone(t, scope)
}

// systemdSandbox runs the sandbox "sb" under the systemd cgroup driver,
// in the scope bbx-<namespace>-<n>.scope of system.slice, and returns the
// scope's cgroup path and a client of the sandbox.
func systemdSandbox(t *testing.T, ctx context.Context, env *daemons.Env, n string, extra ...string) (string, *client.SandboxClient) {
	t.Helper()
	name := env.Namespace + "-" + n
	scope := "/system.slice/bbx-" + name + ".scope"
	args := append([]string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "--cgroup", "system.slice:bbx:" + name}, extra...)
	args = append(args, ociimage.ImageRef, "sb", "sh", "-c", "echo before > /state; exec sleep 100000")
	if _, err := env.Ctr(ctx, args...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		removeContainer(t, env, "sb")
		// Whatever the test left: the unit stopped (systemd kills what
		// is in it) and forgotten.
		_ = exec.Command("systemctl", "stop", filepath.Base(scope)).Run()
		_ = exec.Command("systemctl", "reset-failed", filepath.Base(scope)).Run()
	})
	waitFor(t, func() bool { out, _ := execIn(ctx, env, "sb", "cat", "/state"); return out == "before\n" })
	assertUnit(t, scope, true)
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	if pid := sandboxInitPid(t, ctx, sc); cgroupV2() {
		if cg := procCgroupV2(t, pid); cg != scope && !strings.HasPrefix(cg, scope+"/") {
			t.Fatalf("sandbox init in cgroup %q; want the scope %s", cg, scope)
		}
	}
	return scope, sc
}

// assertUnit checks that systemd has the scope of cgroup path scope
// loaded and active (want), or neither.
func assertUnit(t *testing.T, scope string, want bool) {
	t.Helper()
	unit := filepath.Base(scope)
	out, _ := exec.Command("systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", unit).CombinedOutput()
	active := strings.Contains(string(out), unit) && strings.Contains(string(out), " active ")
	if active != want {
		t.Errorf("unit %s active %v; want %v: %q", unit, active, want, out)
	}
}

// assertScopeGone checks, within 10 seconds, that the sandbox's scope is
// no unit of systemd's any more and its cgroup is gone, branches and all.
func assertScopeGone(t *testing.T, scope string) {
	t.Helper()
	unit := filepath.Base(scope)
	var out []byte
	var dirs []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out, _ = exec.Command("systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", "bbx-*").CombinedOutput()
		dirs, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", scope))
		if d := filepath.Join("/sys/fs/cgroup", scope); isDirPath(d) {
			dirs = append(dirs, d)
		}
		if !strings.Contains(string(out), unit) && len(dirs) == 0 {
			return
		}
	}
	if strings.Contains(string(out), unit) {
		t.Errorf("unit %s left after the sandbox's delete: %q", unit, out)
	}
	if len(dirs) != 0 {
		t.Errorf("cgroups of the sandbox's scope left after its delete: %v", dirs)
	}
}

// procCgroupV2 is the cgroup v2 path of a process ("" on v1).
func procCgroupV2(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	return ""
}

// frozenCgroup says whether a v2 cgroup's cgroup.events says frozen.
func frozenCgroup(cg string) bool {
	b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, "cgroup.events"))
	return strings.Contains(string(b), "frozen 1")
}
