//go:build linux

package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCRIBranchRestricted: a pod container with the restrictions of
// Kubernetes' restricted profile (RuntimeDefault seccomp, runAsUser 1000,
// every capability dropped, allowPrivilegeEscalation false, which the
// kubelet passes as no_new_privs) has its branches started by the branch
// init, and a branch's process keeps every one of them.
func TestCRIBranchRestricted(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("restricted", "branch", ns)
	ctr := c.startFrom(pod, podCfg, "restricted", map[string]any{
		"metadata": map[string]any{"name": "app", "attempt": 0},
		"image":    map[string]any{"image": criAppImage},
		"command":  []string{"/bin/sh", "-c", "echo before > /tmp/state && exec sleep 1000"},
		"log_path": "app.log",
		"linux": map[string]any{
			"security_context": map[string]any{
				"namespace_options": ns.options(),
				"seccomp":           map[string]any{"profile_type": 0}, // RuntimeDefault
				"run_as_user":       map[string]any{"value": 1000},
				"capabilities":      map[string]any{"drop_capabilities": []string{"ALL"}},
				"no_new_privs":      true,
			},
		},
	})
	waitUntil(t, "the container to write its state", 10*time.Second, func() bool {
		out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "cat", "/tmp/state")
		return err == nil && strings.TrimSpace(out) == "before"
	})
	// Writing to /dev/null (a user's, as runc makes it) and not to /.
	report := filterStatus + "; id -u; echo x > /dev/null && (echo x > /root-owned) 2>/dev/null && echo wrote || echo refused"
	want, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "sh", "-c", report)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"Uid:1000100010001000\n", "CapEff:0000000000000000\n", "CapBnd:0000000000000000\n", "NoNewPrivs:1\n", "Seccomp:2\n", "Seccomp_filters:1\n", "1000\nrefused\n"} {
		if !strings.Contains(want, w) {
			t.Fatalf("the pod's container lacks %q:\n%s", w, want)
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
	for _, k := range kids {
		var o client.Output
		st, err := sc.Run(c.ctx, k.ID, client.ExecOptions{Args: []string{"sh", "-c", "cat /proc/1/comm; " + report}, Stdout: &o, Stderr: &o})
		if err != nil || st.Code != 0 {
			t.Fatalf("branch %s: %v %+v %s", k.ID, err, st, o.String())
		}
		if got := o.String(); strings.TrimSpace(got) != "brinit\n"+strings.TrimSpace(want) {
			t.Errorf("branch %s's process:\n%s\nwant the branch init as PID 1 and, as in the container:\n%s", k.ID, got, want)
		}
	}
	for _, k := range kids {
		if _, err := sc.Abort(c.ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
}
