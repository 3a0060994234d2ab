//go:build linux

package sandbox

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// TestBounds: the node's environment and a sandbox's annotations set its
// bounds, each checked where it enters, the annotation over the node.
func TestBounds(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	b, err := nodeBounds(getenv)
	if err != nil || b.maxBranches != DefaultMaxBranches || b.maxDepth != DefaultMaxDepth || b.forkRate != DefaultForkRate {
		t.Fatalf("defaults: %+v %v", b, err)
	}
	env[MaxBranchesEnv], env[ForkRateEnv] = "8", "0.5"
	if b, err = nodeBounds(getenv); err != nil || b.maxBranches != 8 || b.forkRate != 0.5 || !strings.Contains(b.branchesFrom, MaxBranchesEnv) {
		t.Fatalf("node bounds: %+v %v", b, err)
	}
	for k, v := range map[string]string{MaxBranchesEnv: "0", MaxDepthEnv: "257", ForkRateEnv: "NaN"} {
		bad := map[string]string{k: v}
		if _, err := nodeBounds(func(k string) string { return bad[k] }); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v, want invalid argument naming it", k, v, err)
		}
	}
	spec := &specs.Spec{Annotations: map[string]string{MaxBranchesAnnotation: "12", MaxDepthAnnotation: "3"}}
	sb, err := sandboxBounds(b, spec)
	if err != nil || sb.maxBranches != 12 || sb.maxDepth != 3 || sb.forkRate != 0.5 || sb.branchesFrom != "annotation "+MaxBranchesAnnotation {
		t.Fatalf("sandbox bounds: %+v %v", sb, err)
	}
	for _, bad := range []map[string]string{
		{MaxBranchesAnnotation: "1025"}, {MaxBranchesAnnotation: "-1"}, {MaxBranchesAnnotation: "4294967297"},
		{MaxBranchesAnnotation: "1.5"}, {MaxBranchesAnnotation: ""}, {MaxDepthAnnotation: "0"},
		{ForkRateAnnotation: "0"}, {ForkRateAnnotation: "+Inf"}, {ForkRateAnnotation: "1e9"}, {ForkRateAnnotation: "fast"},
	} {
		for k := range bad {
			if _, err := sandboxBounds(b, &specs.Spec{Annotations: bad}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), k) {
				t.Errorf("%v: %v, want invalid argument naming %s", bad, err, k)
			}
		}
	}
}

// TestCheckBranches: a fork is refused, naming the bound, when it would
// make more live branches or deeper ones than the sandbox may have.
func TestCheckBranches(t *testing.T) {
	b := defaultBounds()
	b.maxBranches, b.maxDepth = 4, 2
	sb := &Sandbox{id: "sb", bounds: b, nodes: map[string]*Branch{"0": {id: "0"}}}
	root := sb.nodes["0"]
	if err := sb.checkBranches(root, 4); err != nil {
		t.Fatal(err)
	}
	if err := sb.checkBranches(root, 5); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("count over the maximum: %v", err)
	}
	sb.nodes["1"] = &Branch{id: "1", parent: "0"}
	sb.nodes["2"] = &Branch{id: "2", parent: "1"}
	if err := sb.checkBranches(sb.nodes["1"], 2); err != nil {
		t.Fatalf("depth 2 under 1: %v", err)
	}
	if err := sb.checkBranches(sb.nodes["2"], 1); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "deeper") {
		t.Fatalf("depth 3: %v", err)
	}
	if err := sb.checkBranches(root, 3); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "would make 5") {
		t.Fatalf("2 live + 3: %v", err)
	}
	sb.nodes["3"] = &Branch{id: "3", parent: "0"}
	sb.nodes["4"] = &Branch{id: "4", parent: "0"}
	want := "sandbox sb has 4 live branches, its maximum (the default; annotation io.branchbox.max-branches sets it): abort some first"
	if err := sb.checkBranches(root, 1); !errdefs.IsResourceExhausted(err) || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("at the maximum: %v", err)
	}
}
