package branch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	typesv1 "github.com/branchbox/branchbox/api/types/v1"
	"github.com/containerd/errdefs"
)

// TestCheckpointProtoJSON: the shim writes a checkpoint in protojson into
// the self calls' outcome files, which a `branchctl self` built before the
// field context was renamed branch reads, refusing unknown keys: the key
// stays "context", and either key reads back (a shim built before the
// rename writes "context").
func TestCheckpointProtoJSON(t *testing.T) {
	b, err := protojson.Marshal(CheckpointToProto(Checkpoint{Name: "c1", Branch: "2"}))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["branch"]; ok || m["context"] != "2" {
		t.Fatalf("protojson of a checkpoint: %s, want its branch under \"context\" only", b)
	}
	for _, doc := range []string{`{"name":"c1","context":"2"}`, `{"name":"c1","branch":"2"}`} {
		var ck typesv1.Checkpoint
		if err := protojson.Unmarshal([]byte(doc), &ck); err != nil || ck.GetBranch() != "2" {
			t.Errorf("protojson.Unmarshal(%s): branch %q, %v; want 2", doc, ck.GetBranch(), err)
		}
	}
}

// TestBranchRefWire: the message BranchRef and the fields that hold a
// branch were named Context and context; names are not on the wire, and
// the encoding is still the one the snapshotter and shims built before the
// rename read and write.
func TestBranchRefWire(t *testing.T) {
	str := func(b []byte, num protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), m)
	}
	ref := msg(nil, 1, str(nil, 1, "k")) // Context.root: Root.key
	ref = str(ref, 2, "3")               // Context.branch
	for _, c := range []struct {
		name string
		m    proto.Message
		want []byte
	}{
		{"MountsRequest", &branchv1.MountsRequest{Branch: RefToProto(Ref{Root: Root{Key: "k"}, Branch: "3"}), Checkpoint: "c"},
			str(msg(nil, 1, ref), 2, "c")},
		{"CheckpointRequest", &branchv1.CheckpointRequest{Branch: RefToProto(Ref{Root: Root{Key: "k"}, Branch: "3"}), Name: "c"},
			str(msg(nil, 1, ref), 2, "c")},
		{"RollbackRequest", &branchv1.RollbackRequest{Branch: RefToProto(Ref{Root: Root{Key: "k"}, Branch: "3"}), Name: "c"},
			str(msg(nil, 1, ref), 2, "c")},
		{"WritersDetail", &branchv1.WritersDetail{Branch: "3"}, str(nil, 1, "3")},
		{"Checkpoint", &typesv1.Checkpoint{Name: "c", Branch: "3"}, str(str(nil, 1, "c"), 2, "3")},
	} {
		got, err := proto.MarshalOptions{Deterministic: true}.Marshal(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("%s: encoded %x, want %x", c.name, got, c.want)
		}
	}
}

// TestCheckpointBoundErrorOverGRPC: a checkpoint refused by its bounds
// reaches the shim with its figures and its kind, wrapped as the
// snapshotter wraps it.
func TestCheckpointBoundErrorOverGRPC(t *testing.T) {
	sent := &CheckpointBoundError{Count: 3, MaxCheckpoints: 8, Bytes: 5 << 20, DeletedBytes: 1 << 20, NewBytes: 7 << 20, MaxBytes: 10 << 20}
	got := FromGRPC(ToGRPC(fmt.Errorf("checkpoint sb as %q: %w", "c4", sent)))
	var be *CheckpointBoundError
	want := *sent
	want.Message = `checkpoint sb as "c4": ` + sent.Error()
	if !errors.As(got, &be) || *be != want || got.Error() != want.Message || !errdefs.IsResourceExhausted(got) {
		t.Fatalf("received %v (%#v), want %#v, resource exhausted", got, be, want)
	}
	if be.OverCount() {
		t.Fatal("3 of 8 checkpoints reported as over the count")
	}
	for _, c := range []struct {
		count              int
		bytes, newBytes    int64
		refused, overCount bool
	}{
		{7, 0, 100, false, false},
		{8, 0, 0, true, true},
		{0, 10 << 20, 0, true, false},
		{0, 9 << 20, 1 << 20, false, false},
		{0, 9 << 20, 1<<20 + 1, true, false},
	} {
		err := CheckCheckpointBounds(CheckpointOptions{MaxCheckpoints: 8, MaxBytes: 10 << 20}, c.count, c.bytes, 0, c.newBytes)
		if (err != nil) != c.refused || (err != nil && errors.As(err, &be) && be.OverCount() != c.overCount) {
			t.Errorf("%d checkpoints holding %d, %d more: %v; want refused %v (count %v)", c.count, c.bytes, c.newBytes, err, c.refused, c.overCount)
		}
	}
	if err := CheckCheckpointBounds(CheckpointOptions{}, 1<<20, 1<<50, 0, 1<<40); err != nil {
		t.Errorf("no bounds: %v", err)
	}
}
