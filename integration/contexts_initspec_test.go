//go:build linux

package integration

import (
	"context"
	"testing"

	"github.com/branchbox/branchbox/client"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// schedReport is what a process says of its scheduling and clocks: its
// nice value and policy (/proc/self/stat fields 19 and 41), its I/O
// priority, the CPUs it may use, and whether its boot clock is a year
// ahead (the time namespace's offset).
const schedReport = `cut -d' ' -f19,41 /proc/self/stat; ionice -p $$; grep Cpus_allowed_list /proc/self/status | tr -d '\t'; ` +
	`[ "$(cut -d. -f1 /proc/uptime)" -gt 31536000 ] && echo boottime-offset || echo no-offset`

// TestContextsInitSchedTimens: a sandbox whose spec sets a scheduler, an
// I/O priority, the CPU affinity of exec'd processes and a time namespace
// with clock offsets has its branches started by the branch init, and a
// process exec'd into a branch gets what one exec'd into the sandbox gets.
func TestContextsInitSchedTimens(t *testing.T) {
	const year = 365 * 24 * 3600
	ctx, env, sc := specSandbox(t, func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		s.Process.Scheduler = &specs.Scheduler{Policy: specs.SchedBatch, Nice: 5}
		s.Process.IOPriority = &specs.LinuxIOPriority{Class: specs.IOPRIO_CLASS_BE, Priority: 6}
		s.Process.ExecCPUAffinity = &specs.CPUAffinity{Final: "0"}
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.TimeNamespace})
		s.Linux.TimeOffsets = map[string]specs.LinuxTimeOffset{
			"boottime":  {Secs: year},
			"monotonic": {Secs: year},
		}
		return nil
	})
	want, err := execIn(ctx, env, "sb", "sh", "-c", schedReport)
	if err != nil {
		t.Fatalf("%v: %s", err, want)
	}
	if want != "5 3\nbest-effort: prio 6\nCpus_allowed_list:0\nboottime-offset\n" {
		t.Fatalf("a process exec'd into the sandbox reports:\n%s\nnot what its spec asks", want)
	}
	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	if got := mustRun(t, ctx, sc, kids[0].ID, "cat", "/proc/1/comm"); got != "brinit\n" {
		t.Fatalf("branch's PID 1 is %q; want the branch init", got)
	}
	if got := mustRun(t, ctx, sc, kids[0].ID, "sh", "-c", schedReport); got != want {
		t.Errorf("a process exec'd into a branch reports:\n%s\nwant as in the sandbox:\n%s", got, want)
	}
}

// TestForkSysctls: a sandbox whose spec sets sysctls (nerdctl --sysctl, a
// pod's securityContext.sysctls), as nerdctl --net none runs one: of its
// network namespace and of its IPC namespace. Its branches, of each kind
// (the branch init's, shared or isolated, and memory branches, shared or
// isolated), have them. Before, every fork of such a sandbox through the
// branch init failed ("write /proc/sys/kernel/msgmax: Read-only file
// system": the init wrote them after making /proc/sys read-only, where
// runc writes them before), and an isolated memory branch's new network
// namespace had the kernel's defaults.
func TestForkSysctls(t *testing.T) {
	ctx, env, sc := specSandbox(t, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace}),
		func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
			s.Linux.Sysctl = map[string]string{"net.ipv4.ip_unprivileged_port_start": "77", "kernel.msgmax": "4096"}
			return nil
		})
	const report = "cat /proc/sys/net/ipv4/ip_unprivileged_port_start /proc/sys/kernel/msgmax"
	if out, err := execIn(ctx, env, "sb", "sh", "-c", report); err != nil || out != "77\n4096\n" {
		t.Fatalf("the sandbox's sysctls: %q %v", out, err)
	}
	for _, o := range []client.ForkOptions{
		{Count: 1},
		{Count: 1, Net: "isolated"},
		{Count: 1, WithMemory: true},
		{Count: 1, WithMemory: true, Net: "isolated"},
	} {
		kid := fork(t, ctx, sc, o)[0]
		if got := mustRun(t, ctx, sc, kid.ID, "sh", "-c", report); got != "77\n4096\n" {
			t.Errorf("sysctls in a branch of fork %+v: %q; want the sandbox's", o, got)
		}
		if _, err := sc.Abort(ctx, kid.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// specSandbox runs the sandbox "sb" of the busybox image (sh, exec'ing a
// long sleep) with the spec options opts, as a Go client makes one, and
// returns a branch client for it; both go when the test ends.
func specSandbox(t *testing.T, opts ...oci.SpecOpts) (context.Context, *daemons.Env, *client.SandboxClient) {
	t.Helper()
	ctx, env, cc := shimEnv(t)
	img, err := cc.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cc.NewContainer(ctx, "sb",
		containerd.WithSnapshotter("branch"),
		containerd.WithNewSnapshot("sb", img),
		containerd.WithRuntime(branchRuntime, nil),
		containerd.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img), oci.WithProcessArgs("sh", "-c", "exec sleep 100000")}, opts...)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, "sb") })
	task, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx, env, sandboxClient(t, ctx, env, "sb")
}
