//go:build linux

package integration

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/branchbox/branchbox/client/oci"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestPushFailuresLeaveNodeAsBefore: a push that fails, at whatever
// request, leaves the pushing node as it was: image records (a tag pushed
// before keeps its record), content (the layers, config and manifest it
// made are collected; records, files and ingests), leases, snapshots
// (containerd's and the snapshotter's own Walk, no view of the image
// left) and the snapshotter's directories; and the registry's tag as it
// was. Each request of the push in turn: the connection closed without an
// answer, a 503, the push cancelled while the request waits; the push
// cancelled while it makes its layers; the manifest of a tag pushed
// before refused.
func TestPushFailuresLeaveNodeAsBefore(t *testing.T) {
	reg := startRegistry(t, daemons.RegistryConfig{})
	ctx, env, _ := sandboxCtxEnv(t)
	cc, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	sh := func(script string) {
		t.Helper()
		if out, err := execIn(ctx, env, "sb", "sh", "-c", script); err != nil {
			t.Fatalf("%s in the sandbox: %v: %s", script, err, out)
		}
	}
	push := func(ref string) (string, int) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", "push", "sb", ref, "--plain-http")
		return out + errOut, code
	}
	proxy := startFaultProxy(t, reg)
	// A tag pushed once whole: a failed push of it must keep its record
	// here and its manifest there.
	sh("echo one > /state; head -c 300000 /dev/urandom > /r1")
	if out, errOut, code := branchctl(t, ctx, env, "", "checkpoint", "sb", "first"); code != 0 {
		t.Fatalf("checkpoint: exit %d: %s%s", code, out, errOut)
	}
	pushed := proxy.Host + "/branchbox/p:v1"
	if out, code := push(pushed); code != 0 {
		t.Fatalf("push %s: exit %d: %s", pushed, code, out)
	}
	tag := manifestDigest(t, reg, "branchbox/p", "v1")
	// A change the registry has not seen: the next push makes and sends
	// a new layer, config and manifest.
	sh("echo two > /state; head -c 300000 /dev/urandom > /r2")
	collectGarbage(t, ctx, cc)
	before := stateOf(t, ctx, env, cc)

	// Every request in turn, each try to a repository of its own (the
	// registry keeps the blobs a failed push sent, so a second try to the
	// same one makes fewer requests, and the last ones would go
	// untried).
	for _, fault := range []daemons.Fault{daemons.FaultReset, daemons.FaultUnavailable, daemons.FaultHang} {
		for n := 1; ; n++ {
			if n > 60 {
				t.Fatalf("%s: a push that fails from request 60 on still fails", fault)
			}
			repo := fmt.Sprintf("branchbox/p-%s-%d", fault, n)
			ref := proxy.Host + "/" + repo + ":v1"
			proxy.Reset()
			var out string
			var code int
			if fault == daemons.FaultHang {
				cctx, cancel := context.WithCancel(ctx)
				proxy.Fail(n, fault, cancel)
				_, err := oci.Push(cctx, cc, oci.Source{Sandbox: "sb"}, ref, oci.Remote{PlainHTTP: true})
				cancel()
				if err != nil {
					out, code = err.Error(), 1
				}
			} else {
				proxy.Fail(n, fault, nil)
				out, code = push(ref)
			}
			requests := append([]string{"none made"}, proxy.Requests()...)
			if code == 0 {
				t.Logf("%s: the push got through; its requests: %v", fault, requests[1:])
				if manifestDigest(t, reg, repo, "v1") == "" {
					t.Fatalf("%s: the push that worked left no tag", fault)
				}
				if err := cc.ImageService().Delete(ctx, ref); err != nil {
					t.Fatal(err)
				}
				collectGarbage(t, ctx, cc)
				assertUnchanged(t, ctx, env, cc, before, "a push that worked and the removal of its image")
				break
			}
			what := fmt.Sprintf("a push whose request %d (%s) met fault %s", n, requests[len(requests)-1], fault)
			t.Logf("%s: %s", what, lastLines(strings.TrimSpace(out), 1))
			assertUnchanged(t, ctx, env, cc, before, what)
			if got := manifestDigest(t, reg, repo, "v1"); got != "" {
				t.Fatalf("after %s the registry has the tag (%s)", what, got)
			}
		}
	}

	// Cancelled while it makes its layers (16 MB more: the change layer
	// takes a while), before any request: its view of the image and
	// the blobs it wrote so far go.
	sh("head -c 16777216 /dev/urandom > /big")
	collectGarbage(t, ctx, cc)
	before = stateOf(t, ctx, env, cc)
	sn := cc.SnapshotService("branch")
	building := func() bool {
		found := false
		_ = sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
			found = found || (i.Kind == snapshots.KindView && strings.HasPrefix(i.Name, "branchbox-push-"))
			return nil
		})
		return found
	}
	proxy.Reset()
	cctx, cancel := context.WithCancel(ctx)
	var cancelled atomic.Bool
	go func() {
		for cctx.Err() == nil && !building() {
			time.Sleep(time.Millisecond)
		}
		cancelled.Store(cctx.Err() == nil)
		cancel()
	}()
	_, err = oci.Push(cctx, cc, oci.Source{Sandbox: "sb"}, pushed, oci.Remote{PlainHTTP: true})
	cancel()
	// (containerd's client may report a cut stream as EOF, not the cancel.)
	if err == nil || !cancelled.Load() {
		t.Fatalf("a push to be cancelled while it makes its layers ended before (%v)", err)
	}
	if n := len(proxy.Requests()); n != 0 {
		t.Fatalf("a push cancelled while it makes its layers made %d requests", n)
	}
	t.Logf("push cancelled while it makes its layers: %v", err)
	assertUnchanged(t, ctx, env, cc, before, "a push cancelled while it makes its layers")

	// The manifest, the last request, refused on the tag pushed before:
	// its record and its tag stay as they were.
	proxy.Reset()
	proxy.FailRequest("PUT", "/manifests/", daemons.FaultUnavailable, nil)
	if out, code := push(pushed); code == 0 || !strings.Contains(out, "Service Unavailable") {
		t.Fatalf("push whose manifest the registry refuses: exit %d: %s", code, out)
	}
	assertUnchanged(t, ctx, env, cc, before, "a push of a tag pushed before whose manifest the registry refused")
	if got := manifestDigest(t, reg, "branchbox/p", "v1"); got != tag {
		t.Fatalf("after a failed push the registry's tag is %s, not %s as before", got, tag)
	}
	proxy.Reset()
	if out, code := push(pushed); code != 0 {
		t.Fatalf("retry: exit %d: %s", code, out)
	}
	if got := manifestDigest(t, reg, "branchbox/p", "v1"); got == tag || got == "" {
		t.Fatalf("after the retry the registry's tag is %q", got)
	}
}
