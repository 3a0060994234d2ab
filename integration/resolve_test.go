//go:build linux

package integration

import (
	"os"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestResolveSandbox names sandboxes as containerd, ctr, nerdctl and
// crictl users do, against a real containerd: the full id, a unique id
// prefix, an ambiguous prefix, the nerdctl name and the CRI names (the
// labels kubelet sets; a pod made with crictl is covered by
// TestCRIBranchPodContainer), and lists them with branchctl ls.
func TestResolveSandbox(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	for _, c := range []struct{ id, label string }{
		{"web-7f3a01", "nerdctl/name=frontend"},
		{"web-7f3b02", "io.kubernetes.container.name=app"},
		{"db-0001", ""},
	} {
		args := []string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch"}
		if c.label != "" {
			args = append(args, "--label", c.label)
		}
		if strings.HasPrefix(c.label, "io.kubernetes") {
			args = append(args, "--label", "io.kubernetes.pod.name=pod1")
		}
		args = append(args, ociimage.ImageRef, c.id, "sleep", "100000")
		if _, err := env.Ctr(ctx, args...); err != nil {
			t.Fatal(err)
		}
		id := c.id
		t.Cleanup(func() { removeContainer(t, env, id) })
	}
	for _, tc := range []struct{ name, want, err string }{
		{name: "web-7f3a01", want: "web-7f3a01"},
		{name: "web-7f3b", want: "web-7f3b02"},
		{name: "db", want: "db-0001"},
		{name: "frontend", want: "web-7f3a01"},
		{name: "app", want: "web-7f3b02"},
		{name: "pod1/app", want: "web-7f3b02"},
		{name: "web-7f3", err: `in namespace "` + env.Namespace + `": "web-7f3" names 2 containers: web-7f3a01 ("frontend"), web-7f3b02 ("pod1/app"); give more of the id: invalid argument`},
		{name: "nope\n", err: `in namespace "` + env.Namespace + `": no sandbox "nope\n": no container has that id, id prefix or name: not found`},
	} {
		got, err := client.ResolveSandbox(ctx, env.Address, env.Namespace, tc.name)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: got %q %v, want error %q", tc.name, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %q %v, want %q", tc.name, got, err, tc.want)
		}
	}
	// branchctl takes the same names, and ls shows them with their
	// branches.
	if out, errOut, code := branchctl(t, ctx, env, "", "fork", "frontend", "-n", "2"); code != 0 {
		t.Fatalf("fork frontend: %d %s %s", code, out, errOut)
	}
	out, errOut, code := branchctl(t, ctx, env, "", "ls")
	if code != 0 {
		t.Fatalf("ls: %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "SANDBOX") {
		t.Fatalf("ls: want a header and 3 sandboxes:\n%s", out)
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if strings.HasPrefix(l, "web-7f3a01") && (f[1] != "frontend" || f[2] != "running" || f[3] != "2") {
			t.Errorf("ls: %q; want frontend running with 2 branches", l)
		}
	}
	if _, errOut, code := branchctl(t, ctx, env, "", "tree", "web-7f3"); code == 0 || !strings.Contains(errOut, "names 2 containers") {
		t.Errorf("tree of an ambiguous prefix: %d %q", code, errOut)
	}
	// A full id reaches the sandbox's shim without containerd (its socket
	// follows from the address, namespace and id; the shim confirms it),
	// which every other name needs: with containerd's socket moved away,
	// the id still works and the name is refused.
	moved := env.Address + ".moved"
	if err := os.Rename(env.Address, moved); err != nil {
		t.Fatal(err)
	}
	restore := func() { _ = os.Rename(moved, env.Address) }
	t.Cleanup(restore)
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "web-7f3a01")
	if err != nil {
		t.Fatalf("dial by full id without containerd: %v", err)
	}
	if _, err := sc.Tree(ctx); err != nil {
		t.Fatalf("tree by full id without containerd: %v", err)
	}
	sc.Close()
	if _, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "frontend"); err == nil {
		t.Fatal("dial by name without containerd succeeded; a name is containerd's to resolve")
	}
	restore()
}
