package branch

import (
	"bytes"
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	branchv1 "github.com/branchbox/branchbox/api/branch/v1"
	typesv1 "github.com/branchbox/branchbox/api/types/v1"
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
