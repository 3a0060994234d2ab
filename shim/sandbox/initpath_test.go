//go:build linux

package sandbox

import (
	"strings"
	"testing"

	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/initdriver"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// TestSchedPlan: the scheduler, I/O priority and CPU affinity are encoded
// as runc's conversions give them; the affinity of exec'd processes only,
// and every CPU otherwise; a new time namespace carries the offsets.
func TestSchedPlan(t *testing.T) {
	spec := defaultBranchSpec(t, "/proc/1/ns/net")
	spec.Process.Scheduler = &specs.Scheduler{Policy: specs.SchedBatch, Nice: 5, Flags: []specs.LinuxSchedulerFlag{specs.SchedFlagResetOnFork}}
	spec.Process.IOPriority = &specs.LinuxIOPriority{Class: specs.IOPRIO_CLASS_BE, Priority: 6}
	spec.Process.ExecCPUAffinity = &specs.CPUAffinity{Final: "1,3"}
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.TimeNamespace})
	spec.Linux.TimeOffsets = map[string]specs.LinuxTimeOffset{"boottime": {Secs: 7, Nanosecs: 9}}
	if r := initdriver.Unsupported(spec); r != "" {
		t.Fatalf("the branch init does not take it: %s", r)
	}
	p, err := brinit.NewPlan(spec, "/r", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.ReplaceAll(p.Conf.String(), "\x00", " "); !strings.HasPrefix(got, "timens boottime 7 9\n ") || !strings.Contains(got, " root /r ") {
		t.Errorf("plan %q lacks the time namespace before the root", got)
	}
	for _, c := range []struct {
		exec bool
		want string
	}{
		{true, "sched 3 1 5 0 0 0 0 ioprio 16390 affinity 0a00000000000000"},
		{false, "sched 3 1 5 0 0 0 0 ioprio 16390 affinity  "},
	} {
		var w brinit.Config
		if err := brinit.WriteProc(&w, spec.Process, p.Cfg, c.exec); err != nil {
			t.Fatal(err)
		}
		if got := strings.ReplaceAll(w.String(), "\x00", " "); !strings.Contains(got, c.want) {
			t.Errorf("exec %v: process %q lacks %q", c.exec, got, c.want)
		}
	}
	spec.Process.IOPriority.Class = "IOPRIO_CLASS_NOPE"
	var w brinit.Config
	if err := brinit.WriteProc(&w, spec.Process, p.Cfg, true); err == nil {
		t.Error("an unknown I/O priority class was taken")
	}
}

// TestAppArmorPlan: a profile is handed to the init for every process it
// starts (this host has no AppArmor, so only the plan is tested here; the
// init writes "exec PROFILE" to /proc/thread-self/attr/apparmor/exec, or
// attr/exec, as runc does, and fails the start where runc would fail).
func TestAppArmorPlan(t *testing.T) {
	spec := defaultBranchSpec(t, "/proc/1/ns/net")
	spec.Process.ApparmorProfile = "cri-containerd.apparmor.d"
	if r := initdriver.Unsupported(spec); r != "" {
		t.Fatalf("the branch init does not take it: %s", r)
	}
	p, err := brinit.NewPlan(spec, "/r", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, exec := range []bool{true, false} {
		var w brinit.Config
		if err := brinit.WriteProc(&w, spec.Process, p.Cfg, exec); err != nil {
			t.Fatal(err)
		}
		if got := strings.ReplaceAll(w.String(), "\x00", " "); !strings.Contains(got, " apparmor cri-containerd.apparmor.d ") {
			t.Errorf("process %q lacks the AppArmor profile", got)
		}
	}
}
