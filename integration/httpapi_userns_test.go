//go:build linux

package integration

import (
	"fmt"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/client"
)

// TestHTTPAPIUsernsFiles: the files of a sandbox with a user namespace of
// its own, through the HTTP API, as its root sees them. Its processes'
// /proc files were refused (403: they were opened with no capabilities
// and as the node's root, whom the sandbox's processes do not belong to),
// and a file the API made was owned by the node's root, which the
// sandbox sees as nobody (65534). Now they are opened as its root on the
// node (filesystem ids), and a file made is its root's.
func TestHTTPAPIUsernsFiles(t *testing.T) {
	m := fmt.Sprintf("0:%d:%d", usernsHost, usernsSize)
	ctx, env, sc := sandboxCtxEnv(t, "--uidmap", m, "--gidmap", m)
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1})[0]
	api := newUnixAPI(t, startServe(t, env, false))
	sb := "/v1/namespaces/" + env.Namespace + "/sandboxes/sb"
	if r := api.must(ctx, 200, "GET", sb+"/branches/0/files?path=/proc/1/environ", nil); !strings.Contains(string(r.Body), "PATH=") {
		t.Errorf("the sandbox's /proc/1/environ: %q", r.Body)
	}
	// What its root may not read, neither: the node's kernel log; a
	// branch's init, runc's, which makes itself undumpable.
	api.fails(ctx, 403, "permission-denied", "GET", sb+"/branches/0/files?path=/proc/kmsg", nil)
	if out, err := sc.Run(ctx, kid.ID, client.ExecOptions{Args: []string{"cat", "/proc/1/environ"}}); err != nil || out.Code == 0 {
		t.Fatalf("the branch's root reads its init's environ: %v %v", out, err)
	}
	api.fails(ctx, 403, "permission-denied", "GET", sb+"/branches/"+kid.ID+"/files?path=/proc/1/environ", nil)
	api.must(ctx, 200, "PUT", sb+"/branches/"+kid.ID+"/files?path=/made", []byte("x"))
	if out := mustRun(t, ctx, sc, kid.ID, "stat", "-c", "%u:%g", "/made"); strings.TrimSpace(out) != "0:0" {
		t.Errorf("a file the API made is %s in the sandbox, want root's 0:0", out)
	}
}
