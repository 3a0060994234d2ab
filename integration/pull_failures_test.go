//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/client/oci"
	"github.com/branchbox/branchbox/internal/daemons"
)

// startFaultProxy starts a FaultProxy in front of reg for one test.
func startFaultProxy(t *testing.T, reg *daemons.Registry) *daemons.FaultProxy {
	t.Helper()
	p, err := daemons.NewFaultProxy(reg.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// retagWithCheckpoints puts the manifest of repo:from under repo:to with
// its lineage's checkpoints renamed to names (oldest first): a lineage
// branchbox never pushes, as another tool, or a hand, could write it.
func retagWithCheckpoints(t *testing.T, reg *daemons.Registry, repo, from, to string, names ...string) {
	t.Helper()
	url := "http://" + reg.Host + "/v2/" + repo + "/manifests/"
	req, err := http.NewRequest(http.MethodGet, url+from, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("get manifest %s:%s: %v %s: %s", repo, from, err, resp.Status, body)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	var cks []oci.CheckpointLayer
	if err := json.Unmarshal([]byte(m.Annotations[oci.AnnotationCheckpoints]), &cks); err != nil || len(cks) != len(names) {
		t.Fatalf("manifest %s:%s has checkpoints %+v (%v), want %d", repo, from, cks, err, len(names))
	}
	for i := range cks {
		cks[i].Name = names[i]
	}
	b, err := json.Marshal(cks)
	if err != nil {
		t.Fatal(err)
	}
	m.Annotations[oci.AnnotationCheckpoints] = string(b)
	if body, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	req, err = http.NewRequest(http.MethodPut, url+to, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ocispec.MediaTypeImageManifest)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put manifest %s:%s: %s", repo, to, resp.Status)
	}
}

// TestPullFailuresLeaveNodeAsBefore: a branchctl pull that fails, at
// whatever point, leaves node B as it was: image records, content
// (records, files, ingests), leases, containers, snapshots (containerd's
// and the snapshotter's own Walk) and the snapshotter's directories (no
// checkpoint left of a sandbox that was not made). Failure points: a
// lineage with two checkpoints of the same name (found after the rootfs
// and the first checkpoint were made), every request of the pull in turn
// failing (the registry gone: the connection closed without an answer),
// every answer in turn arriving damaged, the pull cancelled at every
// request in turn and while it builds the rootfs, and a sandbox name
// already taken. A failed pull of a
// tag the node has pulled before leaves that image's record as it was.
func TestPullFailuresLeaveNodeAsBefore(t *testing.T) {
	reg := startRegistry(t, daemons.RegistryConfig{})
	ctx, envA, _ := sandboxCtxEnv(t)
	ctxB, envB, ccB := shimEnv(t)
	sh := func(script string) {
		t.Helper()
		if out, err := execIn(ctx, envA, "sb", "sh", "-c", script); err != nil {
			t.Fatalf("%s in the sandbox: %v: %s", script, err, out)
		}
	}
	ctl := func(env *daemons.Env, args ...string) string {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: exit %d: %s%s", args, code, out, errOut)
		}
		return out
	}
	sh("echo one > /state; head -c 100000 /dev/urandom > /r1")
	ctl(envA, "checkpoint", "sb", "first")
	sh("echo two > /state; head -c 100000 /dev/urandom > /r2")
	ctl(envA, "checkpoint", "sb", "second")
	sh("echo three > /state")
	ctl(envA, "push", "sb", reg.Ref("branchbox/ck:v1"), "--plain-http")
	retagWithCheckpoints(t, reg, "branchbox/ck", "v1", "dup", "first", "first")

	proxy := startFaultProxy(t, reg)
	ref := proxy.Host + "/branchbox/ck:v1"
	pull := func(ref, sandbox string) (string, int) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, envB, "", "pull", ref, sandbox, "--plain-http", "--", "sleep", "1000")
		return out + errOut, code
	}
	// unpull removes what a pull that worked made: its sandbox and its
	// image, then the garbage, for the next round to start from the node
	// as it was.
	unpull := func(sandbox string) {
		t.Helper()
		if c, err := ccB.LoadContainer(ctxB, sandbox); err == nil {
			if err := c.Delete(ctxB, containerd.WithSnapshotCleanup); err != nil {
				t.Fatal(err)
			}
		}
		if err := ccB.ImageService().Delete(ctxB, ref); err != nil {
			t.Fatal(err)
		}
		collectGarbage(t, ctxB, ccB)
	}

	collectGarbage(t, ctxB, ccB)
	before := stateOf(t, ctxB, envB, ccB)

	// Two checkpoints of one name: the second cannot be restored.
	if out, code := pull(proxy.Host+"/branchbox/ck:dup", "dup"); code == 0 || !strings.Contains(out, "already exists") {
		t.Fatalf("pull of a lineage with two checkpoints named first: exit %d:\n%s", code, out)
	}
	assertUnchanged(t, ctxB, envB, ccB, before, "a pull of a lineage with two checkpoints of one name")

	// Every request of the pull in turn fails, then every answer in turn
	// arrives damaged, then the pull is cancelled at every request in
	// turn; until the pull gets through, which ends the round.
	for _, fault := range []daemons.Fault{daemons.FaultReset, daemons.FaultCorrupt, daemons.FaultHang} {
		var requests []string
		for n := 1; ; n++ {
			if n > 40 {
				t.Fatalf("%s: a pull that fails from request 40 on still fails", fault)
			}
			proxy.Reset()
			var out string
			var code int
			if fault == daemons.FaultHang {
				cctx, cancel := context.WithCancel(ctxB)
				proxy.Fail(n, fault, cancel)
				_, err := oci.Pull(cctx, ccB, ref, "f", oci.Remote{PlainHTTP: true}, "sleep", "1000")
				cancel()
				if err != nil {
					out, code = err.Error(), 1
				}
			} else {
				proxy.Fail(n, fault, nil)
				out, code = pull(ref, "f")
			}
			if code == 0 {
				t.Logf("%s: the pull got through; its requests: %v", fault, proxy.Requests())
				unpull("f")
				if d := before.diff(stateOf(t, ctxB, envB, ccB)); d != "" {
					t.Logf("after a pull and the removal of what it made, the node differs from before:\n%s", d)
				}
				collectGarbage(t, ctxB, ccB)
				before = stateOf(t, ctxB, envB, ccB)
				break
			}
			requests = append([]string{"none made"}, proxy.Requests()...)
			t.Logf("%s at request %d (%s): %s", fault, n, requests[len(requests)-1], lastLines(out, 1))
			assertUnchanged(t, ctxB, envB, ccB, before, fmt.Sprintf("a pull whose request %d (%s) met fault %s", n, requests[len(requests)-1], fault))
		}
	}

	// Cancelled while it builds the sandbox's rootfs above the base, layer
	// by layer, a checkpoint after each checkpoint layer (the change, 16
	// MB, takes a while to apply).
	sh("head -c 16777216 /dev/urandom > /big")
	ctl(envA, "push", "sb", reg.Ref("branchbox/ck:big"), "--plain-http")
	proxy.Reset()
	sn := ccB.SnapshotService("branch")
	building := func() bool {
		found := false
		_ = sn.Walk(ctxB, func(_ context.Context, i snapshots.Info) error {
			found = found || (i.Kind == snapshots.KindActive && strings.HasPrefix(i.Name, "big-"))
			return nil
		})
		return found
	}
	cctx, cancel := context.WithCancel(ctxB)
	var cancelled atomic.Bool
	go func() {
		for cctx.Err() == nil && !building() {
			time.Sleep(time.Millisecond)
		}
		cancelled.Store(cctx.Err() == nil)
		cancel()
	}()
	_, err := oci.Pull(cctx, ccB, proxy.Host+"/branchbox/ck:big", "big", oci.Remote{PlainHTTP: true}, "sleep", "1000")
	cancel()
	if err == nil || !cancelled.Load() {
		t.Fatalf("a pull to be cancelled while it builds the rootfs ended before (%v)", err)
	}
	t.Logf("pull cancelled while it builds the rootfs: %v", err)
	assertUnchanged(t, ctxB, envB, ccB, before, "a pull cancelled while it builds the rootfs")

	// A tag the node has pulled: a pull that fails keeps its record.
	proxy.Reset()
	if out, code := pull(ref, "good"); code != 0 {
		t.Fatalf("pull: exit %d: %s", code, out)
	}
	t.Cleanup(func() { removeContainer(t, envB, "good") })
	collectGarbage(t, ctxB, ccB)
	before = stateOf(t, ctxB, envB, ccB)
	if out, code := pull(ref, "good"); code == 0 || !strings.Contains(out, "already exists") {
		t.Fatalf("pull into a sandbox name taken: exit %d:\n%s", code, out)
	}
	assertUnchanged(t, ctxB, envB, ccB, before, "a pull into a sandbox name already taken")
	retagWithCheckpoints(t, reg, "branchbox/ck", "v1", "v1", "second", "second")
	if out, code := pull(ref, "again"); code == 0 || !strings.Contains(out, "already exists") {
		t.Fatalf("pull of v1, now a lineage with two checkpoints named second: exit %d:\n%s", code, out)
	}
	assertUnchanged(t, ctxB, envB, ccB, before, "a failed pull of a tag pulled before")
	// The sandbox the first pull of v1 made runs, with its checkpoints.
	if _, err := envB.Ctr(ctx, "tasks", "start", "-d", "good"); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, envB, "good", "cat", "/state"); err != nil || out != "three\n" {
		t.Fatalf("the pulled sandbox reads %q (%v)", out, err)
	}
	ctl(envB, "rollback", "good", "first")
	if out, err := execIn(ctx, envB, "good", "cat", "/state"); err != nil || out != "one\n" {
		t.Fatalf("the pulled sandbox, rolled back to first, reads %q (%v)", out, err)
	}
}

// manifestDigest is the digest of the manifest reg has under repo:tag
// ("" if none).
func manifestDigest(t *testing.T, reg *daemons.Registry, repo, tag string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodHead, "http://"+reg.Host+"/v2/"+repo+"/manifests/"+tag, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return ""
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD manifest %s:%s: %s", repo, tag, resp.Status)
	}
	return resp.Header.Get("Docker-Content-Digest")
}
