//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestHTTPAPIInSandboxSocket: a sandbox made through the HTTP API with its
// branch socket keeps the socket's isolation and the shim's bounds. From
// inside a branch, the socket reaches that branch alone (not its sibling,
// not the sandbox) and the API's socket is not there; the bound on live
// branches counts the forks of both paths, and refuses either past it with
// the same kind.
func TestHTTPAPIInSandboxSocket(t *testing.T) {
	ctx, env := startEnv(t)
	importInsockImage(t, ctx, env)
	srv := startServe(t, env, false)
	api := newUnixAPI(t, srv)
	removeSandboxesAtEnd(t, srv, env.Namespace)
	ns := "/v1/namespaces/" + env.Namespace
	sb := ns + "/sandboxes/sb"
	api.must(ctx, 201, "POST", ns+"/sandboxes", map[string]any{"id": "sb", "image": insockImage, "socket": true, "args": []string{"sleep", "100000"}})
	defer api.call(ctx, "DELETE", sb, nil)
	var kids apiBranches
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 2}).decode(t, &kids)
	b1, b2 := kids.Branches[0].ID, kids.Branches[1].ID
	run := func(b string, sh string) (string, int) {
		t.Helper()
		r := api.must(ctx, 200, "POST", sb+"/branches/"+b+"/exec", map[string]any{"args": []string{"sh", "-c", sh}})
		out, errOut, exit, kind := execOut(r.Lines)
		if exit == nil {
			t.Fatalf("%s in %s: no exit: %s", sh, b, kind)
		}
		return out + errOut, int(exit["exitCode"].(float64))
	}

	out, code := run(b1, "branchctl self tree --json")
	if code != 0 {
		t.Fatalf("self tree in %s: %d %s", b1, code, out)
	}
	var st selfTree
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("self tree: %q: %v", out, err)
	}
	if ids := st.ids(); !slices.Equal(ids, []string{b1}) {
		t.Fatalf("branch %s's socket reaches %v, want only itself", b1, ids)
	}
	if out, code := run(b1, "branchctl self abort "+b2); code == 0 {
		t.Fatalf("branch %s aborted its sibling %s through its socket: %s", b1, b2, out)
	}
	if out, code := run(b1, fmt.Sprintf("ls /run/branchbox; test ! -e %s && test ! -e %s", srv.Socket, filepath.Dir(srv.Socket))); code != 0 || strings.TrimSpace(out) != "branch.sock" {
		t.Fatalf("inside a branch: %d %q, want only its branch socket and no API socket", code, out)
	}

	// 64 live branches at most (docs/limits.md), counted over both paths.
	api.fails(ctx, 429, "resource-exhausted", "POST", sb+"/fork", map[string]any{"count": 63})
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": 61})
	out, code = run(b1, "branchctl self fork -n 2 --json")
	if code == 0 || !strings.Contains(out, `"resource-exhausted"`) {
		t.Fatalf("self fork past the bound: %d %s", code, out)
	}
	out, code = run(b1, "branchctl self fork -n 1 --json")
	if code != 0 {
		t.Fatalf("self fork of the 64th: %d %s", code, out)
	}
	api.fails(ctx, 429, "resource-exhausted", "POST", sb+"/fork", map[string]any{"count": 1})
}
