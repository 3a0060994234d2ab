//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/initdriver"
)

// defaultBranchSpec is a branch spec derived from containerd's default
// spec, as ctr run makes it, with a bind mount.
func defaultBranchSpec(t *testing.T, netns string) *specs.Spec {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), "test")
	gen, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	s := *gen
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro", "nosuid", "noexec", "nodev"}},
		specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/etc/hosts", Options: []string{"rbind", "ro"}})
	s.Linux.CgroupsPath = "/test/sb"
	b, err := branchSpec(&s, "/test/sb/b1", joinNS{net: netns}, &shimv1.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ops splits an init config into its ops (name and arguments).
func ops(t *testing.T, conf []byte) [][]string {
	t.Helper()
	arity := map[string]int{"mount": 5, "bind": 4, "mknod": 6, "symlink": 2, "mask": 1, "readonly": 1, "setns": 1,
		"root": 2, "pivot": 0, "write": 2, "hostname": 1, "domainname": 1, "lo": 0, "cgroupns": 0, "rootro": 0, "remount": 2, "seccomp": 2, "timens": 1,
		"propagate": 2}
	words := strings.Split(strings.TrimSuffix(string(conf), "\x00"), "\x00")
	var out [][]string
	for i := 0; i < len(words); {
		n, ok := arity[words[i]]
		if !ok || i+1+n > len(words) {
			t.Fatalf("op %q at word %d: unknown or short", words[i], i)
		}
		out = append(out, words[i:i+1+n])
		i += 1 + n
	}
	return out
}

func TestPlanFast(t *testing.T) {
	spec := defaultBranchSpec(t, "/proc/42/ns/net")
	if r := initdriver.Unsupported(spec); r != "" {
		t.Fatalf("containerd's default spec needs the runtime: %s", r)
	}
	paths := map[string]string{"memory": "/sys/fs/cgroup/memory/test/sb/b1", "cpu": "/sys/fs/cgroup/cpu,cpuacct/test/sb/b1", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct/test/sb/b1"}
	p, err := brinit.NewPlan(spec, "/run/b/rootfs", paths, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No mount namespace at the clone: the init makes its own (op root).
	if want := uintptr(unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS); p.Clone != want {
		t.Errorf("clone flags %#x, want %#x (the sandbox's network is joined)", p.Clone, want)
	}
	list := ops(t, p.Conf.Bytes())
	index := func(pred func([]string) bool) int {
		for i, o := range list {
			if pred(o) {
				return i
			}
		}
		return -1
	}
	setns := index(func(o []string) bool { return o[0] == "setns" && o[1] == "/proc/42/ns/net" })
	// The node's mounts are made slaves, as runc's default rootfs
	// propagation (rslave).
	root := index(func(o []string) bool {
		return o[0] == "root" && o[1] == "/run/b/rootfs" && o[2] == strconv.Itoa(unix.MS_SLAVE|unix.MS_REC)
	})
	proc := index(func(o []string) bool { return o[0] == "mount" && o[2] == "/proc" && o[3] == "proc" })
	bind := index(func(o []string) bool { return o[0] == "bind" && o[1] == "/etc/hosts" && o[2] == "/etc/hosts" })
	null := index(func(o []string) bool { return o[0] == "mknod" && o[1] == "/dev/null" })
	cg := index(func(o []string) bool {
		return o[0] == "bind" && o[1] == paths["cpu"] && o[2] == "/sys/fs/cgroup/cpu,cpuacct"
	})
	cgLink := index(func(o []string) bool {
		return o[0] == "symlink" && o[1] == "cpu,cpuacct" && o[2] == "/sys/fs/cgroup/cpuacct"
	})
	pivot := index(func(o []string) bool { return o[0] == "pivot" })
	mask := index(func(o []string) bool { return o[0] == "mask" && o[1] == "/proc/keys" })
	ro := index(func(o []string) bool { return o[0] == "readonly" && o[1] == "/proc/sys" })
	if cgroups.IsCgroup2UnifiedMode() {
		cg, cgLink = proc, proc // one bind of the unified tree instead
	}
	for name, i := range map[string]int{"setns": setns, "root": root, "proc": proc, "bind": bind, "/dev/null": null, "cgroup bind": cg, "cgroup link": cgLink, "pivot": pivot, "mask": mask, "readonly": ro} {
		if i < 0 {
			t.Errorf("no %s op in %q", name, list)
		}
	}
	if !(setns < root && root < proc && proc < pivot && bind < pivot && null < pivot && cg < pivot && pivot < mask && pivot < ro) {
		t.Errorf("ops out of order (setns %d, root %d, proc %d, bind %d, null %d, cgroup %d, pivot %d, mask %d, readonly %d)", setns, root, proc, bind, null, cg, pivot, mask, ro)
	}
	if i := index(func(o []string) bool { return o[0] == "hostname" || o[0] == "lo" }); i >= 0 {
		t.Errorf("op %q: the default spec sets no host name and the network is the sandbox's", list[i])
	}

	// A new network namespace is cloned and gets its loopback up.
	isolated := defaultBranchSpec(t, "")
	p, err = brinit.NewPlan(isolated, "/run/b/rootfs", paths, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Clone&unix.CLONE_NEWNET == 0 || !bytes.Contains(p.Conf.Bytes(), []byte("\x00lo\x00")) {
		t.Errorf("isolated network: clone flags %#x; want CLONE_NEWNET and the lo op", p.Clone)
	}
}

// TestPlanPropagation: a volume's propagation (Kubernetes' None and
// HostToContainer: rprivate, rslave) is set after its bind, and a spec's
// rootfs propagation replaces the default (rslave), as runc applies them.
func TestPlanPropagation(t *testing.T) {
	spec := defaultBranchSpec(t, "/proc/42/ns/net")
	spec.Linux.RootfsPropagation = "rprivate"
	spec.Mounts = append(spec.Mounts,
		specs.Mount{Destination: "/none", Type: "bind", Source: "/tmp", Options: []string{"rbind", "rprivate"}},
		specs.Mount{Destination: "/host-to-container", Type: "bind", Source: "/tmp", Options: []string{"rbind", "rslave"}})
	if r := initdriver.Unsupported(spec); r != "" {
		t.Fatalf("the branch init would not run it: %s", r)
	}
	p, err := brinit.NewPlan(spec, "/run/b/rootfs", map[string]string{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(ops(t, p.Conf.Bytes()))
	for _, want := range []string{
		fmt.Sprint([]string{"root", "/run/b/rootfs", strconv.Itoa(unix.MS_PRIVATE | unix.MS_REC)}),
		fmt.Sprint([]string{"bind", "/tmp", "/none", strconv.Itoa(unix.MS_BIND | unix.MS_REC), "1"}) + " " +
			fmt.Sprint([]string{"propagate", "/none", strconv.Itoa(unix.MS_PRIVATE | unix.MS_REC)}),
		fmt.Sprint([]string{"bind", "/tmp", "/host-to-container", strconv.Itoa(unix.MS_BIND | unix.MS_REC), "1"}) + " " +
			fmt.Sprint([]string{"propagate", "/host-to-container", strconv.Itoa(unix.MS_SLAVE | unix.MS_REC)}),
	} {
		if !strings.Contains(got, want) {
			t.Errorf("plan %s lacks %s", got, want)
		}
	}
	// A rootfs propagation that is not recursive is made so: the rootfs
	// is attached below the node's mounts, which must not be its peers.
	spec.Linux.RootfsPropagation = "slave"
	if p, err = brinit.NewPlan(spec, "/run/b/rootfs", map[string]string{}, nil); err != nil {
		t.Fatal(err)
	}
	got = fmt.Sprint(ops(t, p.Conf.Bytes()))
	if want := fmt.Sprint([]string{"root", "/run/b/rootfs", strconv.Itoa(unix.MS_SLAVE | unix.MS_REC)}); !strings.Contains(got, want) {
		t.Errorf("plan %s lacks %s", got, want)
	}
}

func TestFastUnsupported(t *testing.T) {
	for name, mod := range map[string]func(*specs.Spec){
		"seccomp notify": func(s *specs.Spec) {
			s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActNotify}}}
		},
		"seccomp listener": func(s *specs.Spec) {
			s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, ListenerPath: "/run/agent.sock"}
		},
		"memory policy": func(s *specs.Spec) { s.Linux.MemoryPolicy = &specs.LinuxMemoryPolicy{Mode: specs.MpolLocal} },
		"personality":   func(s *specs.Spec) { s.Linux.Personality = &specs.LinuxPersonality{Domain: specs.PerLinux32} },
		"ptrace": func(s *specs.Spec) {
			s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_PTRACE")
		},
		"selinux": func(s *specs.Spec) { s.Process.SelinuxLabel = "l" },
		"recursive read-only mount": func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/tmp", Options: []string{"rbind", "rprivate", "rro"}})
		},
		"user namespace": func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		},
		// A Kubernetes volume with Bidirectional propagation.
		"shared volume": func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/tmp", Options: []string{"rbind", "rshared"}})
			s.Linux.RootfsPropagation = "rshared"
		},
		"shared volume, rootfs propagation unset": func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/tmp", Options: []string{"rbind", "rshared"}})
		},
		"shared rootfs": func(s *specs.Spec) { s.Linux.RootfsPropagation = "shared" },
	} {
		s := defaultBranchSpec(t, "/proc/1/ns/net")
		mod(s)
		if r := initdriver.Unsupported(s); r == "" {
			t.Errorf("%s: the branch init would run it", name)
		}
	}
}

func TestProcConfig(t *testing.T) {
	spec := defaultBranchSpec(t, "/proc/1/ns/net")
	spec.Process.Args = []string{"sh", "-c", "x"}
	spec.Process.User = specs.User{UID: 5, GID: 6, AdditionalGids: []uint32{7}}
	var w brinit.Config
	p, err := brinit.NewPlan(spec, "/r", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := brinit.WriteProc(&w, spec.Process, p.Cfg, true); err != nil {
		t.Fatal(err)
	}
	got := strings.ReplaceAll(w.String(), "\x00", " ")
	for _, want := range []string{"arg sh arg -c arg x ", "user 5 6 group 7 ", "nnp ", "rlimit 7 1024 1024 "} {
		if !strings.Contains(got, want) {
			t.Errorf("process config %q lacks %q", got, want)
		}
	}
	spec.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOPE"}}
	if err := brinit.WriteProc(&w, spec.Process, p.Cfg, true); err == nil {
		t.Error("an unknown rlimit was taken")
	}
}

// TestBranchSpecLeavesParent: a branch's spec, with limits and a command of
// its own, shares what it does not change with its parent's and changes
// nothing of it.
func TestBranchSpecLeavesParent(t *testing.T) {
	parent := defaultBranchSpec(t, "")
	mem := int64(1 << 30)
	parent.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &mem}
	before, err := json.Marshal(parent)
	if err != nil {
		t.Fatal(err)
	}
	b, err := branchSpec(parent, "/test/sb/b1/b2", joinNS{net: "/proc/7/ns/net"}, &shimv1.ForkRequest{
		Args:   []string{"sh", "-c", "true"},
		Limits: &shimv1.Limits{Memory: 1 << 20, Cpus: 0.5, Pids: 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := json.Marshal(parent)
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Fatalf("branchSpec changed its parent's spec:\nbefore %s\nafter  %s", before, after)
	}
	if got := *b.Linux.Resources.Memory.Limit; got != 1<<20 {
		t.Errorf("branch memory limit %d, want %d", got, 1<<20)
	}
	if b.Linux.Resources.CPU == nil || *b.Linux.Resources.CPU.Quota != 50000 || *b.Linux.Resources.Pids.Limit != 10 {
		t.Errorf("branch cpu and pids limits %+v %+v", b.Linux.Resources.CPU, b.Linux.Resources.Pids)
	}
	if b.Linux.CgroupsPath != "/test/sb/b1/b2" || b.Process.Args[0] != "sh" || (len(parent.Process.Args) > 0 && parent.Process.Args[0] == "sh") {
		t.Errorf("branch cgroup %q args %v; parent args %v", b.Linux.CgroupsPath, b.Process.Args, parent.Process.Args)
	}
}

// TestBranchSpecUserns: a branch of a parent with a user namespace of its
// own joins that namespace (by the parent's init's path) with the same
// mappings; one the parent joined by path is joined by the same path.
func TestBranchSpecUserns(t *testing.T) {
	m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 196608, Size: 65536}}
	for _, tc := range []struct{ path, want string }{
		{"", "/proc/7/ns/user"},
		{"/run/pinned/userns", "/run/pinned/userns"},
	} {
		parent := defaultBranchSpec(t, "")
		parent.Linux.UIDMappings, parent.Linux.GIDMappings = m, m
		parent.Linux.Namespaces = append(parent.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: tc.path})
		b, err := branchSpec(parent, "/test/sb/b1/b2", joinNS{net: "/proc/7/ns/net", user: "/proc/7/ns/user"}, &shimv1.ForkRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range b.Linux.Namespaces {
			if n.Type == specs.UserNamespace {
				got = append(got, n.Path)
			}
		}
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("parent's user namespace %q: branch's %q, want %q", tc.path, got, tc.want)
		}
		if len(b.Linux.UIDMappings) != 1 || b.Linux.UIDMappings[0] != m[0] || len(b.Linux.GIDMappings) != 1 {
			t.Errorf("branch's mappings %v %v, want the parent's %v", b.Linux.UIDMappings, b.Linux.GIDMappings, m)
		}
		for _, n := range parent.Linux.Namespaces {
			if n.Type == specs.UserNamespace && n.Path != tc.path {
				t.Errorf("the parent's spec was changed: user namespace %q", n.Path)
			}
		}
	}
	// A parent in the host's user namespace gives its branches none.
	b, err := branchSpec(defaultBranchSpec(t, ""), "/test/sb/b1/b2", joinNS{user: "/proc/7/ns/user"}, &shimv1.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range b.Linux.Namespaces {
		if n.Type == specs.UserNamespace {
			t.Fatalf("a branch of a parent without a user namespace has one: %+v", n)
		}
	}
}

// TestRuntimeSpec: a branch the runtime runs leaves its parent's limits
// and cpuset to its parent's cgroup (they may have been updated since the
// parent's create), keeps its devices, and takes the fork's limits.
func TestRuntimeSpec(t *testing.T) {
	limit, quota, period, pids := int64(1<<30), int64(50000), uint64(100000), int64(100)
	parent := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{
		CgroupsPath: "/unit-test-no-such-cgroup/b1",
		Resources: &specs.LinuxResources{
			Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			Memory:  &specs.LinuxMemory{Limit: &limit},
			CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period, Cpus: "0-1", Mems: "0"},
			Pids:    &specs.LinuxPids{Limit: &pids},
		}}}
	got := runtimeSpec(parent, nil).Linux.Resources
	if got.Memory.Limit != nil || got.CPU.Quota != nil || got.CPU.Cpus != "" || got.CPU.Mems != "" || got.Pids != nil {
		t.Errorf("the parent's limits kept: %+v %+v %+v", got.Memory, got.CPU, got.Pids)
	}
	if len(got.Devices) != 1 {
		t.Errorf("devices %+v; want the parent's", got.Devices)
	}
	if *parent.Linux.Resources.Memory.Limit != limit || parent.Linux.Resources.CPU.Cpus != "0-1" {
		t.Errorf("the parent's spec changed: %+v", parent.Linux.Resources)
	}
	got = runtimeSpec(parent, &shimv1.Limits{Memory: 1 << 20, Pids: 7}).Linux.Resources
	if got.Memory.Limit == nil || *got.Memory.Limit != 1<<20 || got.Pids == nil || *got.Pids.Limit != 7 || got.CPU.Quota != nil {
		t.Errorf("the fork's limits: %+v %+v %+v", got.Memory, got.Pids, got.CPU)
	}
}
