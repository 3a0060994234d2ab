package branch

import (
	"encoding/json"
	"testing"
)

// TestCheckpointJSON: a checkpoint's branch is in JSON under "branch" and
// under its old key "context", which the clients built before the rename
// read; either key reads back.
func TestCheckpointJSON(t *testing.T) {
	ck := Checkpoint{Name: "c1", Branch: "2", Size: 7, Branches: []string{"3"}}
	b, err := json.Marshal(ck)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["branch"] != "2" || m["context"] != "2" || m["name"] != "c1" || m["size"] != float64(7) {
		t.Fatalf("checkpoint as JSON: %s; want its branch as both branch and context", b)
	}
	for _, doc := range []string{string(b), `{"name":"c1","context":"2"}`, `{"name":"c1","branch":"2"}`} {
		var back Checkpoint
		if err := json.Unmarshal([]byte(doc), &back); err != nil || back.Name != "c1" || back.Branch != "2" {
			t.Errorf("%s read back as %+v, %v", doc, back, err)
		}
	}
}
