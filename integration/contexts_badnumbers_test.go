//go:build linux

package integration

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
)

// TestContextsBadNumbers: every number a fork or a kill takes is checked
// where it enters, through branchctl and the Go client: a count of 0 or
// one that does not fit 32 bits, CPUs that are not a finite number in the
// kernel's range, memory under the minimum, a negative process limit, a
// signal the kernel does not have. Each is refused as invalid argument
// with one line naming the number, and nothing is made.
func TestContextsBadNumbers(t *testing.T) {
	ctx, env, sc := sandboxCtxEnv(t)
	for _, args := range [][]string{
		{"-n", "0"},
		{"-n", "4294967297"},
		{"-n", "-1"},
		{"--cpus", "NaN"},
		{"--cpus", "Inf"},
		{"--cpus", "1e-12"},
		{"--cpus", "-1"},
		{"--memory", "1"}, // the old spelling of --memory-limit
		{"--memory-limit", "1"},
		{"--pids", "-1"},
	} {
		_, stderr, code := branchctl(t, ctx, env, "", append([]string{"fork", "sb"}, args...)...)
		if code == 0 {
			t.Errorf("fork %v: succeeded", args)
			continue
		}
		// One line of error; branchctl adds a line of hint.
		first, _, _ := strings.Cut(strings.TrimSpace(stderr), "\n")
		if !strings.HasSuffix(first, ": invalid argument") || !strings.Contains(first, strings.TrimLeft(args[1], "-")) {
			t.Errorf("fork %v: want a line naming the number and ending in invalid argument, got %q", args, stderr)
		}
	}
	if _, err := sc.Fork(ctx, client.ForkOptions{Count: 0}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("fork of 0 branches through the client: %v, want invalid argument", err)
	}
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range tree {
		if c.ID != branch.RootID {
			t.Fatalf("a refused fork made branch %s (%s)", c.ID, c.State)
		}
	}

	kids := fork(t, ctx, sc, client.ForkOptions{Count: 1})
	p, err := sc.Exec(ctx, kids[0].ID, client.ExecOptions{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for _, sig := range []uint32{0, 65, 1 << 31} {
		if err := p.Kill(ctx, sig); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "signal") {
			t.Errorf("kill with signal %d: %v, want invalid argument naming the signal", sig, err)
		}
	}
	if err := p.Kill(ctx, 9); err != nil {
		t.Fatalf("kill with SIGKILL: %v", err)
	}
	if _, err := sc.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
}
