//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	cseccomp "github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

const sysprobeImage = "docker.io/branchbox/sysprobe:test"

// importSysprobeImage imports the busybox image with sysprobe (a static
// Go program issuing raw system calls, integration/sysprobe) at
// /bin/sysprobe, into the branch snapshotter.
func importSysprobeImage(t *testing.T, ctx context.Context, env *daemons.Env) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sysprobe")
	build := exec.Command("go", "build", "-o", bin, "./sysprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build sysprobe: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	importToolImage(t, ctx, env, sysprobeImage, "bin/sysprobe", data)
}

// runProbeSandbox runs sandbox id of the sysprobe image with ctr's extra
// flags and returns a branch client for it.
func runProbeSandbox(t *testing.T, ctx context.Context, env *daemons.Env, id string, extra ...string) *client.SandboxClient {
	t.Helper()
	args := append([]string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch"}, extra...)
	args = append(args, sysprobeImage, id, "sh", "-c", "echo before > /state; exec sleep 100000")
	if _, err := env.Ctr(ctx, args...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, id) })
	waitFor(t, func() bool { out, _ := execIn(ctx, env, id, "cat", "/state"); return out == "before\n" })
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

// probeScript runs sysprobe on each probe in a process of its own, so that
// a probe the filter kills shows as its exit status.
func probeScript(probes []string) string {
	var b strings.Builder
	// What the shell says of a killed probe goes to stderr, which ctr
	// exec does not return.
	b.WriteString("exec 2>/dev/null; ")
	for _, p := range probes {
		b.WriteString("sysprobe " + p + "; echo \"  exit $?\"; ")
	}
	return b.String()
}

// filterStatus is what /proc/self/status says of a process's seccomp
// state and privileges.
const filterStatus = `grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs|CapEff|CapBnd|Uid):' /proc/self/status | tr -d '\t '`

// compareProbes runs probes in the sandbox (a runc exec) and in a branch
// (the branch init's exec) and fails where they differ; it returns the
// branch's output.
func compareProbes(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, id, branchID string, probes []string) string {
	t.Helper()
	script := probeScript(probes) + filterStatus
	want, err := execIn(ctx, env, id, "sh", "-c", script)
	if err != nil {
		t.Fatalf("probes in sandbox %s: %v: %s", id, err, want)
	}
	got := mustRun(t, ctx, sc, branchID, "sh", "-c", script)
	if got != want {
		t.Errorf("sandbox %s: a branch's probes:\n%s\nwant as in the sandbox:\n%s", id, got, want)
	}
	return got
}

// hostStatus reads a line of /proc/PID/status from the host.
func hostStatus(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return ""
}

// TestContextsSeccompDefault: a sandbox with containerd's default profile
// (ctr run --seccomp, as nerdctl and the CRI's RuntimeDefault) has its
// branches started by the branch init, whose processes carry the same
// filter: seccomp mode 2, as many filters as the sandbox's process, and
// the same errno for every call the profile blocks (and success for one it
// allows), in exec'd processes and in a branch's own command.
func TestContextsSeccompDefault(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	importSysprobeImage(t, ctx, env)
	sc := runProbeSandbox(t, ctx, env, "sb", "--seccomp")
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 2})
	a := kids[0]
	if got := mustRun(t, ctx, sc, a.ID, "cat", "/proc/1/comm"); got != "brinit\n" {
		t.Fatalf("branch's PID 1 is %q; want the branch init", got)
	}
	probes := []string{"getpid", "keyctl", "add_key", "request_key", "bpf", "unshare-user", "mount", "ptrace", "nr:462", "nr:470"}
	got := compareProbes(t, ctx, env, sc, "sb", a.ID, probes)
	// The profile is on: it blocks keyctl with EPERM (unfiltered, it
	// succeeds) and lets getpid through.
	for _, want := range []string{"getpid 0\n", "keyctl 1\n", "add_key 1\n", "bpf 1\n", "Seccomp:2\n", "Seccomp_filters:1\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("branch's probes lack %q:\n%s", want, got)
		}
	}
	// The sandbox's own process, read from the host, against a branch's
	// process.
	pid, err := strconv.Atoi(sandboxPid(t, sc))
	if err != nil {
		t.Fatal(err)
	}
	if m, n := hostStatus(t, pid, "Seccomp"), hostStatus(t, pid, "Seccomp_filters"); m != "2" || !strings.Contains(got, "Seccomp_filters:"+n+"\n") {
		t.Errorf("sandbox's process: Seccomp %s, Seccomp_filters %s; the branch's:\n%s", m, n, got)
	}
	// The init itself is not filtered (it sets up what it starts); every
	// process it starts is.
	if m := hostStatus(t, a.InitPid, "Seccomp"); m != "0" {
		t.Errorf("branch init's seccomp mode %s; want 0", m)
	}
	// A branch's own command, started at fork, is filtered the same.
	cmdKids := fork(t, ctx, sc, client.ForkOptions{Count: 1, Args: []string{"sh", "-c", "(" + probeScript(probes) + filterStatus + ") > /out; exec sleep 1000"}})
	waitFor(t, func() bool {
		out, _, _ := runErr(ctx, sc, cmdKids[0].ID, "cat", "/out")
		return strings.Contains(out, "Uid:")
	})
	if out := mustRun(t, ctx, sc, cmdKids[0].ID, "cat", "/out"); out != got {
		t.Errorf("a branch's command:\n%s\nwant as its exec'd processes:\n%s", out, got)
	}
	// Nested: a branch of a branch keeps the filter.
	nested := fork(t, ctx, sc, client.ForkOptions{Count: 1, Parent: a.ID})
	if out := mustRun(t, ctx, sc, nested[0].ID, "sh", "-c", probeScript(probes)+filterStatus); out != got {
		t.Errorf("a nested branch:\n%s\nwant:\n%s", out, got)
	}
	if !strings.Contains(env.Log("containerd"), "started by the branch init") {
		t.Errorf("the shim did not log which way the sandbox's branches start")
	}
}

func writeProfile(t *testing.T, p *specs.LinuxSeccomp) string {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "profile.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func errnoPtr(e unix.Errno) *uint { v := uint(e); return &v }

// TestContextsSeccompProfiles: custom profiles (an allow-list whose
// default errno has a value, a deny list with errno values and a kill
// action, rules with argument comparisons, a log action with the log
// flag) behave the same in a sandbox and in its branch.
func TestContextsSeccompProfiles(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	importSysprobeImage(t, ctx, env)
	allow := cseccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}})
	allow.DefaultErrnoRet = errnoPtr(unix.EACCES)
	for i, c := range []struct {
		name    string
		profile *specs.LinuxSeccomp
		probes  []string
		want    []string // lines the branch's output must have
	}{
		{"allow list, default errno EACCES", allow,
			[]string{"getpid", "keyctl", "bpf", "nr:470"}, []string{"getpid 0\n", "keyctl 13\n", "bpf 13\n"}},
		{"deny list, errno values and kill", &specs.LinuxSeccomp{
			DefaultAction: specs.ActAllow,
			Syscalls: []specs.LinuxSyscall{
				{Names: []string{"keyctl"}, Action: specs.ActErrno, ErrnoRet: errnoPtr(unix.EOPNOTSUPP)},
				{Names: []string{"add_key"}, Action: specs.ActKillProcess},
				{Names: []string{"request_key"}, Action: specs.ActErrno},
			}},
			[]string{"getpid", "keyctl", "add_key", "request_key"},
			[]string{"keyctl 95\n", "  exit 159\n", "request_key 1\n"}},
		{"argument comparisons", &specs.LinuxSeccomp{
			DefaultAction: specs.ActAllow,
			Syscalls: []specs.LinuxSyscall{
				{Names: []string{"prctl"}, Action: specs.ActErrno, ErrnoRet: errnoPtr(unix.ENOTTY),
					Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.PR_GET_DUMPABLE, Op: specs.OpEqualTo}}},
				// Conditions on two arguments must all hold.
				{Names: []string{"setpriority"}, Action: specs.ActErrno, ErrnoRet: errnoPtr(unix.EDOM),
					Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.PRIO_PROCESS, Op: specs.OpEqualTo}, {Index: 2, Value: 10, Op: specs.OpLessThan}}},
				// Two on one argument are separate rules (runc's reading):
				// either blocks.
				{Names: []string{"personality"}, Action: specs.ActErrno, ErrnoRet: errnoPtr(unix.ERANGE),
					Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x8, Op: specs.OpEqualTo}, {Index: 0, Value: 0xffffffff, Op: specs.OpEqualTo}}},
			}},
			[]string{"prctl-dumpable", "prctl-nnp", "setpriority-7", "setpriority-12", "personality-query", "personality-0"},
			[]string{"prctl-dumpable 25\n", "prctl-nnp 0\n", "setpriority-7 33\n", "setpriority-12 0\n", "personality-query 34\n", "personality-0 0\n"}},
		{"log action and log flag", &specs.LinuxSeccomp{
			DefaultAction: specs.ActAllow,
			Flags:         []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog},
			Syscalls: []specs.LinuxSyscall{
				{Names: []string{"getppid"}, Action: specs.ActLog},
				{Names: []string{"keyctl"}, Action: specs.ActErrno},
			}},
			[]string{"getppid", "keyctl"}, []string{"getppid 0\n", "keyctl 1\n"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := "sb" + strconv.Itoa(i)
			sc := runProbeSandbox(t, ctx, env, id, "--seccomp", "--seccomp-profile", writeProfile(t, c.profile))
			kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
			if got := mustRun(t, ctx, sc, kids[0].ID, "cat", "/proc/1/comm"); got != "brinit\n" {
				t.Fatalf("branch's PID 1 is %q; want the branch init", got)
			}
			got := compareProbes(t, ctx, env, sc, id, kids[0].ID, c.probes)
			for _, w := range append(c.want, "Seccomp:2\n") {
				if !strings.Contains(got, w) {
					t.Errorf("branch's probes lack %q:\n%s", w, got)
				}
			}
		})
	}
}
