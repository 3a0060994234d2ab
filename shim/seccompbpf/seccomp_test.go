//go:build linux && cgo && seccomp

package seccompbpf

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	cseccomp "github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// loadEnv names the profile (JSON) a re-run of the test binary loads with
// runc's own seccomp.InitSeccomp.
const loadEnv = "SECCOMPBPF_TEST_LOAD"

func TestMain(m *testing.M) {
	if path := os.Getenv(loadEnv); path != "" {
		loadAndSpin(path)
	}
	os.Exit(m.Run())
}

// loadAndSpin loads a profile with runc on one thread, reports that
// thread's id and spins without a system call, for the test to read the
// kernel's copy of the filter with ptrace.
func loadAndSpin(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	var s specs.LinuxSeccomp
	if err := json.Unmarshal(b, &s); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	cfg, err := specconv.SetupSeccomp(&s)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	runtime.LockOSThread()
	// No signal may reach the filtered thread: an allow-list profile
	// refuses rt_sigreturn, so the thread would crash on the way back
	// from a handler (Go's preemption signal, SIGURG, above all) and be
	// exiting when the test attaches (ptrace: EPERM).
	all := unix.Sigset_t{}
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &all, nil); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("TID", unix.Gettid())
	// runc loads without TSYNC: only this thread is filtered.
	if _, err := seccomp.InitSeccomp(cfg); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	//lint:ignore SA5002 a filtered thread must make no system call; the test kills it
	for {
	}
}

// kernelFilter runs runc's load of profile in a child and returns the
// program the kernel holds for it.
func kernelFilter(t *testing.T, profile *specs.LinuxSeccomp) []unix.SockFilter {
	t.Helper()
	b, err := json.Marshal(profile)
	if err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/profile.json"
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// Without asynchronous preemption the runtime sends the spinning
	// thread no SIGURG (blocked there too, see loadAndSpin).
	cmd.Env = append(os.Environ(), loadEnv+"="+path, "GODEBUG=asyncpreemptoff=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "TID ") {
		t.Fatalf("runc's load: %q %v", line, err)
	}
	tid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "TID ")))
	status := fmt.Sprintf("/proc/%d/task/%d/status", cmd.Process.Pid, tid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b, _ := os.ReadFile(status)
		if strings.Contains(string(b), "\nSeccomp:\t2\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runc did not load the filter: %s", b)
		}
	}
	// What Go's preemption does at any moment, done here on purpose: the
	// thread must survive it (see loadAndSpin).
	if err := unix.Tgkill(cmd.Process.Pid, tid, unix.SIGURG); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(status); !sigPending(string(b), unix.SIGURG) {
		t.Fatalf("SIGURG was not held back on the filtered thread: %s", b)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		t.Fatalf("ptrace seize: %v", err)
	}
	defer func() {
		// On failure, the tracer reaps the thread it held.
		_ = unix.Kill(cmd.Process.Pid, unix.SIGKILL)
		_, _ = unix.Wait4(tid, nil, unix.WALL|unix.WNOHANG, nil)
	}()
	if err := unix.PtraceInterrupt(tid); err != nil {
		t.Fatal(err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		t.Fatal(err)
	}
	n, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(tid), 0, 0, 0, 0)
	if errno != 0 {
		t.Fatalf("PTRACE_SECCOMP_GET_FILTER: %v", errno)
	}
	prog := make([]unix.SockFilter, n)
	if _, _, errno := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SECCOMP_GET_FILTER, uintptr(tid), 0, uintptr(unsafe.Pointer(&prog[0])), 0, 0); errno != 0 {
		t.Fatalf("PTRACE_SECCOMP_GET_FILTER: %v", errno)
	}
	// Let go of the thread before the child is killed: a traced thread's
	// exit waits for its tracer.
	if err := unix.PtraceDetach(tid); err != nil {
		t.Fatal(err)
	}
	return prog
}

// sigPending reports whether status (a /proc task status) shows sig
// pending for the thread.
func sigPending(status string, sig unix.Signal) bool {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "SigPnd:\t"); ok {
			mask, err := strconv.ParseUint(v, 16, 64)
			return err == nil && mask&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}

func errnoRet(v uint) *uint { return &v }

// probeInputs are the calls the programs are compared on: every syscall
// number up to 600 (and x32's) on x86_64, i386, a foreign and a bogus
// architecture, with all arguments zero, and with each argument a profile
// compares set to around the value it is compared with.
func probeInputs(profile *specs.LinuxSeccomp) []*seccompData {
	const (
		auditX86_64  = 0xc000003e
		auditI386    = 0x40000003
		auditAArch64 = 0xc00000b7
		x32Bit       = 0x40000000
	)
	type argv struct {
		i int
		v uint64
	}
	variants := [][]argv{nil}
	for _, sc := range profile.Syscalls {
		var all []argv
		for _, a := range sc.Args {
			for _, v := range []uint64{a.Value, a.Value + 1, a.Value - 1, a.ValueTwo, a.Value | a.ValueTwo, ^uint64(0)} {
				variants = append(variants, []argv{{int(a.Index), v}})
			}
			all = append(all, argv{int(a.Index), a.Value})
		}
		if len(all) > 1 {
			variants = append(variants, all)
		}
	}
	var out []*seccompData
	for _, arch := range []uint32{auditX86_64, auditI386, auditAArch64, 0} {
		for nr := int32(-1); nr <= 600; nr++ {
			nrs := []int32{nr}
			if arch == auditX86_64 && nr >= 0 {
				nrs = append(nrs, nr|x32Bit)
			}
			for _, n := range nrs {
				for _, v := range variants {
					d := &seccompData{nr: n, arch: arch, ip: 0x401000}
					for _, a := range v {
						d.args[a.i] = a.v
					}
					out = append(out, d)
				}
			}
		}
	}
	return out
}

// testProfiles are the profiles both sides compile: containerd's default
// (what nerdctl, ctr --seccomp and the CRI's RuntimeDefault use) and
// custom ones for each kind of rule.
func testProfiles() map[string]*specs.LinuxSeccomp {
	return map[string]*specs.LinuxSeccomp{
		"containerd default": cseccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
			Bounding: []string{"CAP_CHOWN", "CAP_NET_RAW", "CAP_SETUID"},
		}}}),
		"default errno with a value, extra architectures": {
			DefaultAction:   specs.ActErrno,
			DefaultErrnoRet: errnoRet(uint(unix.EACCES)),
			Architectures:   []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
			Syscalls: []specs.LinuxSyscall{{
				Names: []string{"read", "write", "exit_group", "execve", "mmap", "brk"}, Action: specs.ActAllow,
			}},
		},
		"deny list: errno value, kill, trap": {
			DefaultAction: specs.ActAllow,
			Syscalls: []specs.LinuxSyscall{
				{Names: []string{"keyctl"}, Action: specs.ActErrno, ErrnoRet: errnoRet(uint(unix.EOPNOTSUPP))},
				{Names: []string{"add_key"}, Action: specs.ActKillProcess},
				{Names: []string{"request_key"}, Action: specs.ActTrap},
			},
		},
		"argument comparisons": {
			DefaultAction: specs.ActAllow,
			Syscalls: []specs.LinuxSyscall{
				{Names: []string{"prctl"}, Action: specs.ActErrno, ErrnoRet: errnoRet(uint(unix.ENOTTY)),
					Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.PR_GET_DUMPABLE, Op: specs.OpEqualTo}}},
				{Names: []string{"unshare"}, Action: specs.ActErrno,
					Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.CLONE_NEWUSER, ValueTwo: unix.CLONE_NEWUSER, Op: specs.OpMaskedEqual}}},
				{Names: []string{"setpriority"}, Action: specs.ActErrno, ErrnoRet: errnoRet(uint(unix.EDOM)),
					Args: []specs.LinuxSeccompArg{{Index: 2, Value: 5, Op: specs.OpGreaterThan}, {Index: 2, Value: 10, Op: specs.OpLessThan}}},
			},
		},
		"log action and flags": {
			DefaultAction: specs.ActAllow,
			Flags:         []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog, specs.LinuxSeccompFlagSpecAllow},
			Syscalls: []specs.LinuxSyscall{
				{Names: []string{"getppid"}, Action: specs.ActLog},
				{Names: []string{"keyctl"}, Action: specs.ActErrno},
			},
		},
	}
}

// TestCompileIsRuncsFilter compiles profiles and compares the program
// with the one runc's own InitSeccomp loads into the kernel for them,
// instruction by instruction, and the flags with the profile's.
func TestCompileIsRuncsFilter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (seccomp without no_new_privs, ptrace)")
	}
	for name, profile := range testProfiles() {
		t.Run(name, func(t *testing.T) {
			cfg, err := specconv.SetupSeccomp(profile)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Compile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := kernelFilter(t, profile)
			// runc's ENOSYS stub orders its architectures by a Go map's
			// iteration, so two loads of one profile may differ in
			// instruction order: compare what the programs decide.
			if len(p.Filter) != len(want) {
				t.Fatalf("program of %d instructions, runc loads %d", len(p.Filter), len(want))
			}
			inputs := 0
			for _, d := range probeInputs(profile) {
				got, err := run(p.Filter, d)
				if err != nil {
					t.Fatalf("ours: %v", err)
				}
				w, err := run(want, d)
				if err != nil {
					t.Fatalf("runc's: %v", err)
				}
				if got != w {
					t.Fatalf("syscall %d arch %#x args %#x: verdict %#x, runc's %#x", d.nr, d.arch, d.args, got, w)
				}
				inputs++
			}
			// runc's specconv asks for SPEC_ALLOW when a profile names
			// no flags at all.
			flags := uint(unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW)
			if profile.Flags != nil {
				flags = 0
			}
			for _, f := range profile.Flags {
				switch f {
				case specs.LinuxSeccompFlagLog:
					flags |= unix.SECCOMP_FILTER_FLAG_LOG
				case specs.LinuxSeccompFlagSpecAllow:
					flags |= unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
				}
			}
			if p.Flags != flags {
				t.Fatalf("flags %#x, want %#x", p.Flags, flags)
			}
			t.Logf("%d instructions, same verdicts as runc's on %d inputs", len(p.Filter), inputs)
			if len(p.Bytes()) != 8*len(p.Filter) {
				t.Fatalf("%d bytes for %d instructions", len(p.Bytes()), len(p.Filter))
			}
		})
	}
}

// TestCompileRefusesNotify: a profile with a notify action stays with the
// runtime, which hands its listener to the agent.
func TestCompileRefusesNotify(t *testing.T) {
	cfg, err := specconv.SetupSeccomp(&specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow, ListenerPath: "/run/agent.sock",
		Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActNotify}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !HasNotify(cfg) {
		t.Fatal("HasNotify: false for a notify rule")
	}
	if _, err := Compile(cfg); err == nil {
		t.Fatal("Compile of a notify profile succeeded")
	}
}

// BenchmarkCompileDefault is the cost of compiling containerd's default
// profile, paid once per sandbox.
func BenchmarkCompileDefault(b *testing.B) {
	cfg, err := specconv.SetupSeccomp(cseccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Compile(cfg); err != nil {
			b.Fatal(err)
		}
	}
}
