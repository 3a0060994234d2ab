//go:build linux

package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/api/openapi"
	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/containerd/errdefs"
)

// TestRoutesAreTheContract: every route the server serves is an operation
// of api/openapi/branchbox.json, and every operation is served.
func TestRoutesAreTheContract(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openapi.Spec, &doc); err != nil {
		t.Fatal(err)
	}
	var inDoc []string
	for path, ops := range doc.Paths {
		for method := range ops {
			if path != "/v1/openapi.json" {
				inDoc = append(inDoc, strings.ToUpper(method)+" "+path)
			}
		}
	}
	var served []string
	for pattern := range (&Server{}).routeTable() {
		served = append(served, pattern)
	}
	sort.Strings(inDoc)
	sort.Strings(served)
	if strings.Join(inDoc, "\n") != strings.Join(served, "\n") {
		t.Fatalf("the routes served and the contract's differ:\nserved:\n%s\ncontract:\n%s", strings.Join(served, "\n"), strings.Join(inDoc, "\n"))
	}
}

// TestErrorKinds: every kind client.ErrorKind returns is in the
// contract's Error schema and has its status.
func TestErrorKinds(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []any `json:"enum"` // strings for kind; KeepAlive's is [true]
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapi.Spec, &doc); err != nil {
		t.Fatal(err)
	}
	var enum []string
	for _, e := range doc.Components.Schemas["Error"].Properties["kind"].Enum {
		enum = append(enum, fmt.Sprint(e))
	}
	sort.Strings(enum)
	kinds := client.ErrorKinds()
	sort.Strings(kinds)
	if strings.Join(enum, ",") != strings.Join(kinds, ",") {
		t.Fatalf("the contract's error kinds %v are not the client's %v", enum, kinds)
	}
	for _, k := range kinds {
		if st := statusOf(k); st < 400 || (st == 500 && k != "unknown") {
			t.Errorf("kind %s: status %d", k, st)
		}
	}
}

// TestStoppedErr: a request whose context the server's stop ended is
// unavailable, not the client's cancel.
func TestStoppedErr(t *testing.T) {
	cut := fmt.Errorf("fork of sb: %w", context.Canceled)
	if k := errorOf(stoppedErr(cut, true)).Kind; k != "unavailable" {
		t.Errorf("cut by the server's stop: %s", k)
	}
	if k := errorOf(stoppedErr(cut, false)).Kind; k != "canceled" {
		t.Errorf("cut by the client: %s", k)
	}
	other := fmt.Errorf("fork: %w", errdefs.ErrNotFound)
	if k := errorOf(stoppedErr(other, true)).Kind; k != "not-found" {
		t.Errorf("another error while stopping: %s", k)
	}
}

// TestCheckpointBoundHint: a checkpoint refused by the sandbox's bounds
// (the shim's words, which name branchctl) gets a hint in the API's
// terms; another resource-exhausted error does not.
func TestCheckpointBoundHint(t *testing.T) {
	words := `checkpoint "c9" of sandbox sb: it has 256 checkpoints, its maximum (the default; ...): delete some first (branchctl checkpoint rm sb NAME): resource exhausted`
	bound := branch.FromGRPC(branch.ToGRPC(&branch.CheckpointBoundError{Count: 256, MaxCheckpoints: 256, Message: words}))
	e := errorOf(bound)
	if e.Kind != "resource-exhausted" || e.Message != words || !strings.Contains(e.Hint, "DELETE .../checkpoints/{name}") {
		t.Fatalf("checkpoint bound: %+v", e)
	}
	for _, other := range []error{
		fmt.Errorf("this client already has 8 execs running: %w", errdefs.ErrResourceExhausted),
		// No room for the checkpoint's memory image: deleting checkpoints
		// would not help, the message says what would.
		fmt.Errorf(`checkpoint "c1" of sandbox sb: its processes hold about 120MiB of memory, and their image would not fit ...: %w`, errdefs.ErrResourceExhausted),
	} {
		if e := errorOf(other); strings.Contains(e.Hint, "checkpoints") {
			t.Fatalf("another resource exhausted: %+v", e)
		}
	}
}
