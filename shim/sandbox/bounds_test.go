//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/branch"
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
	if b.callRate != DefaultCallRate {
		t.Fatalf("call rate %v, want the default %d", b.callRate, DefaultCallRate)
	}
	spec := &specs.Spec{Annotations: map[string]string{MaxBranchesAnnotation: "12", MaxDepthAnnotation: "3", CallRateAnnotation: "2.5"}}
	sb, err := sandboxBounds(b, spec)
	if err != nil || sb.maxBranches != 12 || sb.maxDepth != 3 || sb.forkRate != 0.5 || sb.branchesFrom != "annotation "+MaxBranchesAnnotation ||
		sb.callRate != 2.5 || sb.callRateFrom != "annotation "+CallRateAnnotation {
		t.Fatalf("sandbox bounds: %+v %v", sb, err)
	}
	for _, bad := range []map[string]string{
		{MaxBranchesAnnotation: "1025"}, {MaxBranchesAnnotation: "-1"}, {MaxBranchesAnnotation: "4294967297"},
		{MaxBranchesAnnotation: "1.5"}, {MaxBranchesAnnotation: ""}, {MaxDepthAnnotation: "0"},
		{ForkRateAnnotation: "0"}, {ForkRateAnnotation: "+Inf"}, {ForkRateAnnotation: "1e9"}, {ForkRateAnnotation: "fast"},
		{CallRateAnnotation: "0.5"}, {CallRateAnnotation: "100001"}, {CallRateAnnotation: "lots"},
	} {
		for k := range bad {
			if _, err := sandboxBounds(b, &specs.Spec{Annotations: bad}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), k) {
				t.Errorf("%v: %v, want invalid argument naming %s", bad, err, k)
			}
		}
	}
}

// TestCheckpointBoundSettings: the checkpoint bounds take a count and a
// size in bytes or with a binary unit; the refusal names the bound and
// where it was set.
func TestCheckpointBoundSettings(t *testing.T) {
	b := defaultBounds()
	if b.maxCheckpoints != DefaultMaxCheckpoints || b.maxCheckpointBytes != 10<<30 {
		t.Fatalf("defaults: %+v", b)
	}
	env := map[string]string{MaxCheckpointBytesEnv: "512MiB", MaxCheckpointsEnv: "40"}
	b, err := nodeBounds(func(k string) string { return env[k] })
	if err != nil || b.maxCheckpointBytes != 512<<20 || b.maxCheckpoints != 40 {
		t.Fatalf("node bounds: %+v %v", b, err)
	}
	for v, want := range map[string]int64{"2g": 2 << 30, "1073741824": 1 << 30, "1.5GiB": 3 << 29, "1024k": 1 << 20} {
		sb, err := sandboxBounds(b, &specs.Spec{Annotations: map[string]string{MaxCheckpointBytesAnnotation: v}})
		if err != nil || sb.maxCheckpointBytes != want {
			t.Errorf("%s = %q: %d %v, want %d", MaxCheckpointBytesAnnotation, v, sb.maxCheckpointBytes, err, want)
		}
	}
	for _, v := range []string{"0", "1000", "-1GiB", "lots", "2PiB", ""} {
		_, err := sandboxBounds(b, &specs.Spec{Annotations: map[string]string{MaxCheckpointBytesAnnotation: v}})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "want a size (bytes, or with a unit") {
			t.Errorf("%s = %q: %v, want invalid argument asking for a size", MaxCheckpointBytesAnnotation, v, err)
		}
	}
	for _, v := range []string{"0", "65537", "1e3"} {
		if _, err := sandboxBounds(b, &specs.Spec{Annotations: map[string]string{MaxCheckpointsAnnotation: v}}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s = %q: %v, want invalid argument", MaxCheckpointsAnnotation, v, err)
		}
	}
	sb := &Sandbox{id: "sb", bounds: defaultBounds()}
	err = sb.checkpointRefused("c9", fmt.Errorf("checkpoint: %w", &branch.CheckpointBoundError{Count: 256, MaxCheckpoints: 256, MaxBytes: 10 << 30}), false)
	want := `checkpoint "c9" of sandbox sb: it has 256 checkpoints, its maximum (the default; annotation io.branchbox.max-checkpoints sets it): delete some first (branchctl checkpoint rm sb NAME): resource exhausted`
	if err == nil || err.Error() != want || !errdefs.IsResourceExhausted(err) {
		t.Errorf("count refusal:\n%v\nwant\n%s", err, want)
	}
	// Past the shim's ttrpc the words and the type both arrive: the HTTP
	// API and MCP tell a bound from a full disk by the type.
	var be *branch.CheckpointBoundError
	if back := branch.FromGRPC(toTTRPC(err)); !errors.As(back, &be) || back.Error() != want || be.Count != 256 || !errdefs.IsResourceExhausted(back) {
		t.Errorf("count refusal over the wire: %#v (%v)", back, back)
	}
	err = sb.checkpointRefused("c9", &branch.CheckpointBoundError{Count: 3, MaxCheckpoints: 256, Bytes: 9 << 30, DeletedBytes: 1 << 30, NewBytes: 2 << 30, MaxBytes: 10 << 30}, true)
	want = `checkpoint "c9" of sandbox sb: its checkpoints hold 9GiB (1GiB of it deleted checkpoints' layers that later ones build on), and this one's 2GiB would take them past their maximum of 10GiB (the default; annotation io.branchbox.max-checkpoint-bytes sets it): delete some first (branchctl self checkpoint rm NAME); a deleted checkpoint's layer counts until no later checkpoint builds on it: resource exhausted`
	if err == nil || err.Error() != want {
		t.Errorf("bytes refusal:\n%v\nwant\n%s", err, want)
	}
	err = sb.checkpointRefused("c9", &branch.CheckpointBoundError{Count: 1, MaxCheckpoints: 1}, true)
	if err == nil || !strings.Contains(err.Error(), ": it has 1 checkpoint, its maximum (") {
		t.Errorf("count refusal at one: %v", err)
	}
	if other := errors.New("boom"); sb.checkpointRefused("c9", other, false) != other {
		t.Error("another error reworded")
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
	one := &Sandbox{id: "one", bounds: b, nodes: map[string]*Branch{"0": {id: "0"}, "1": {id: "1", parent: "0"}}}
	one.bounds.maxBranches = 1
	if err := one.checkBranches(one.nodes["0"], 1); err == nil || !strings.HasPrefix(err.Error(), "sandbox one has 1 live branch, its maximum") {
		t.Fatalf("at a maximum of one: %v", err)
	}
	sb.nodes["3"] = &Branch{id: "3", parent: "0"}
	sb.nodes["4"] = &Branch{id: "4", parent: "0"}
	want := "sandbox sb has 4 live branches, its maximum (the default; annotation io.branchbox.max-branches sets it): abort some first"
	if err := sb.checkBranches(root, 1); !errdefs.IsResourceExhausted(err) || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("at the maximum: %v", err)
	}
}
