//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/fstest"
)

// startRegistry starts a registry on loopback for one test and removes it
// and its storage when the test ends.
func startRegistry(t *testing.T, cfg daemons.RegistryConfig) *daemons.Registry {
	t.Helper()
	requireRoot(t)
	reg, err := daemons.StartRegistry(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("registry log:\n%s", lastLines(reg.Log(), 60))
		}
		if err := reg.Stop(); err != nil {
			t.Errorf("stop registry: %v", err)
		}
	})
	return reg
}

// compareAsLayers is fstest.Compare up to what an OCI layer carries:
// containerd's layer writer keeps mtimes to the second (reproducible
// layers), and no layer holds the root directory's own mtime.
func compareAsLayers(a, b string) error {
	diffs, err := fstest.Diff(a, b)
	if err != nil {
		return err
	}
	var real []string
	for _, d := range diffs {
		if d.What == "mtime" {
			ta, _ := strconv.ParseInt(d.A, 10, 64)
			tb, _ := strconv.ParseInt(d.B, 10, 64)
			if d.Path == "." || ta/1e9 == tb/1e9 {
				continue
			}
		}
		real = append(real, d.String())
	}
	if len(real) > 0 {
		return fmt.Errorf("trees %s and %s differ:\n  %s", a, b, strings.Join(real, "\n  "))
	}
	return nil
}

// pushOut is what branchctl push --json prints.
type pushOut struct {
	Ref      string `json:"ref"`
	Manifest string `json:"manifest"`
	Change   struct {
		Digest string `json:"digest"`
		Size   int64  `json:"size"`
	} `json:"change"`
	SentBlobs    int   `json:"sentBlobs"`
	SentBytes    int64 `json:"sentBytes"`
	SkippedBlobs int   `json:"skippedBlobs"`
}

// TestRegistryPushBranchRunElsewhere pushes a branch of a running sandbox
// on node A to a real registry, pulls it on node B (which has the base
// image, as a node that ran it before) with ctr into the branch
// snapshotter, and runs it there as a sandbox: B's rootfs equals the
// branch's file by file, B's running process sees the change, and B forks
// it at once. A second push after a 1 KB change sends one new layer and
// nothing of the base.
func TestRegistryPushBranchRunElsewhere(t *testing.T) {
	reg := startRegistry(t, daemons.RegistryConfig{})
	ctx, envA, scA := sandboxCtxEnv(t)
	_, envB, _ := shimEnv(t)

	// Node A: the sandbox changes its root (a deleted base file, a hard
	// link, a symlink, modes), then a branch changes more over it.
	sh := func(script string) {
		t.Helper()
		if out, err := execIn(ctx, envA, "sb", "sh", "-c", script); err != nil {
			t.Fatalf("%s in the sandbox: %v: %s", script, err, out)
		}
	}
	sh("mkdir -p /data/sub && echo root > /data/f && ln /data/f /data/hard && ln -s ../f /data/sub/link && chmod 0751 /data/sub && rm /bin/true")
	kids := fork(t, ctx, scA, client.ForkOptions{Count: 1})
	b := kids[0].ID
	mustRun(t, ctx, scA, b, "sh", "-c", "echo branch > /data/g && rm -r /etc && mkdir /etc && echo fresh > /etc/only && echo more >> /state")

	ctl := func(args ...string) string {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, envA, "", args...)
		if code != 0 {
			t.Fatalf("branchctl %v: exit %d: %s%s", args, code, out, errOut)
		}
		return out
	}
	ref := reg.Ref("branchbox/sb:v1")
	var first pushOut
	if err := json.Unmarshal([]byte(ctl("push", "sb/"+b, ref, "--plain-http", "--json")), &first); err != nil {
		t.Fatal(err)
	}
	// Layer (base and change), config, manifest: all new to this registry.
	if first.SentBlobs != 4 {
		t.Fatalf("first push sent %d blobs, want 4 (base layer, change layer, config, manifest): %+v", first.SentBlobs, first)
	}

	// Node B pulls with containerd's own client into the branch
	// snapshotter and runs it as a sandbox.
	gets := len(reg.BlobDownloads())
	if _, err := envB.Ctr(ctx, "images", "pull", "--plain-http", "--snapshotter", "branch", ref); err != nil {
		t.Fatal(err)
	}
	// B has the base: it fetches the config and the change layer only.
	var fetched []string
	var moved int64
	for _, d := range reg.BlobDownloads()[gets:] {
		fetched = append(fetched, d.Digest)
		moved += d.Bytes
	}
	if len(fetched) != 2 || !slices.Contains(fetched, first.Change.Digest) {
		t.Fatalf("node B, which has the base, fetched blobs %v; want the config and the change layer %s only", fetched, first.Change.Digest)
	}
	t.Logf("pull on a node with the base moved %d bytes (change layer %d)", moved, first.Change.Size)
	if _, err := envB.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", ref, "sb2", "sh", "-c", "exec sleep 100000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, envB, "sb2") })

	// B's rootfs equals A's branch file by file: A's branch through a
	// read-only mount of its mounts, B's through its task's rootfs.
	bc, rootA := snapshotterRoot(t, envA, "sb")
	defer bc.Close()
	msA, err := bc.Mounts(ctx, branch.Ref{Root: rootA, Branch: b})
	if err != nil {
		t.Fatal(err)
	}
	rootfsB := envB.ContainerdState + "/io.containerd.runtime.v2.task/" + envB.Namespace + "/sb2/rootfs"
	if err := mount.WithReadonlyTempMount(ctx, msA, func(rootA string) error {
		return compareAsLayers(rootA, rootfsB)
	}); err != nil {
		t.Fatal(err)
	}

	// B's running process sees the branch's files.
	out, err := execIn(ctx, envB, "sb2", "sh", "-c", "cat /data/g /data/hard /data/sub/link /etc/only /state; ls /etc; test -e /bin/true || echo no-true")
	if err != nil {
		t.Fatal(err)
	}
	if want := "branch\nroot\nroot\nfresh\nbefore\nmore\nonly\nno-true\n"; out != want {
		t.Fatalf("sandbox on node B sees %q, want %q", out, want)
	}

	// A fork on B works at once, over the pulled state.
	scB, err := client.NewSandboxClient(ctx, envB.Address, envB.Namespace, "sb2")
	if err != nil {
		t.Fatal(err)
	}
	defer scB.Close()
	kidsB := fork(t, ctx, scB, client.ForkOptions{Count: 1})
	if got := mustRun(t, ctx, scB, kidsB[0].ID, "sh", "-c", "cat /data/g; echo onB > /data/g"); got != "branch\n" {
		t.Fatalf("branch on node B reads %q", got)
	}
	if _, err := scB.Commit(ctx, kidsB[0].ID); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, envB, "sb2", "cat", "/data/g"); err != nil || out != "onB\n" {
		t.Fatalf("after commit on node B: %q %v", out, err)
	}

	// A second push after a 1 KB change: one new layer reaches the
	// registry, with the new config and manifest; the base is not sent.
	before, err := reg.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	uploadsBefore := reg.BlobUploads()
	mustRun(t, ctx, scA, b, "sh", "-c", "head -c 1024 /dev/urandom > /data/kb")
	var second pushOut
	if err := json.Unmarshal([]byte(ctl("push", "sb/"+b, reg.Ref("branchbox/sb:v2"), "--plain-http", "--json")), &second); err != nil {
		t.Fatal(err)
	}
	after, err := reg.Blobs()
	if err != nil {
		t.Fatal(err)
	}
	var added []string
	for _, d := range after {
		if !slices.Contains(before, d) {
			added = append(added, d)
		}
	}
	slices.Sort(added)
	want := []string{second.Manifest, second.Change.Digest}
	if len(added) != 3 || !slices.Contains(added, second.Manifest) || !slices.Contains(added, second.Change.Digest) {
		t.Fatalf("second push added blobs %v to the registry; want 3: the manifest and change layer %v, and the config", added, want)
	}
	if n := reg.BlobUploads() - uploadsBefore; n != 2 {
		t.Fatalf("second push uploaded %d blobs (registry access log), want 2: the change layer and the config", n)
	}
	if second.SentBlobs != 3 || second.SkippedBlobs != 1 {
		t.Fatalf("second push reports %d sent, %d skipped; want 3 (layer, config, manifest) and 1 (the base layer)", second.SentBlobs, second.SkippedBlobs)
	}
	if !strings.HasPrefix(second.Change.Digest, "sha256:") || second.Change.Digest == first.Change.Digest {
		t.Fatalf("second push's change layer %s is the first's %s", second.Change.Digest, first.Change.Digest)
	}
}

// TestRegistryPushFaults: bad input and registry faults each end in a
// clear error with nothing half-made: no image recorded under the
// reference, the tag absent from the registry. A registry that refuses
// authentication, one that is down, and one killed in the middle of an
// upload: after each, a retry works.
func TestRegistryPushFaults(t *testing.T) {
	// Behind a link of 1 MB/s each way: a transfer of the 4 MB below
	// lasts long enough to be cut in the middle, here and under emulation.
	reg := startRegistry(t, daemons.RegistryConfig{User: "agent", Password: "s3cret", Rate: 1 << 20})
	ctx, env, _ := sandboxCtxEnv(t)
	cc, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	collectGarbage(t, ctx, cc)
	before := stateOf(t, ctx, env, cc)
	push := func(args ...string) (string, int) {
		t.Helper()
		out, errOut, code := branchctl(t, ctx, env, "", append([]string{"push"}, args...)...)
		return out + errOut, code
	}
	ref := reg.Ref("branchbox/faults:v1")
	noImage := func(what string) {
		t.Helper()
		out, err := env.Ctr(ctx, "images", "ls", "-q")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, ref) {
			t.Fatalf("after %s an image %s is recorded:\n%s", what, ref, out)
		}
		if reg.Pid() != 0 && reg.HasTag("branchbox/faults", "v1", "agent", "s3cret") {
			t.Fatalf("after %s the registry has the tag", what)
		}
		assertUnchanged(t, ctx, env, cc, before, what)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nosuch", ref, "--plain-http", "--user", "agent:s3cret"}, `no sandbox "nosuch"`},
		{[]string{"sb/99", ref, "--plain-http", "--user", "agent:s3cret"}, "sandbox sb has no branch 99"},
		{[]string{"sb", "Not A Ref", "--plain-http"}, `image reference "Not A Ref"`},
		{[]string{"sb@nope", ref, "--plain-http", "--user", "agent:s3cret"}, `sandbox sb has no checkpoint "nope"`},
		{[]string{"sb"}, "want push SANDBOX[/BRANCH] REF"},
		{[]string{"sb", ref, "--plain-http"}, "refused the credentials"},
		{[]string{"sb", ref, "--plain-http", "--user", "agent:wrong"}, "refused the credentials"},
	} {
		out, code := push(c.args...)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Fatalf("push %v: exit %d, want an error with %q:\n%s", c.args, code, c.want, out)
		}
		noImage(fmt.Sprintf("push %v", c.args))
	}

	// A registry that is down.
	if err := reg.Kill(); err != nil {
		t.Fatal(err)
	}
	if out, code := push("sb", ref, "--plain-http", "--user", "agent:s3cret"); code == 0 || !strings.Contains(out, "does not answer") {
		t.Fatalf("push to a registry that is down: exit %d:\n%s", code, out)
	}
	noImage("a push to a registry that is down")
	if err := reg.Restart(ctx); err != nil {
		t.Fatal(err)
	}

	// A registry killed while the change layer is being uploaded: 4 MB
	// that does not compress, which the link takes 4 s to carry.
	big := int64(4 << 20)
	if out, err := execIn(ctx, env, "sb", "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /big", big)); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	killed := make(chan error, 1)
	go func() { killed <- reg.KillWhenUploading(ctx, 1<<20) }()
	out, code := push("sb", ref, "--plain-http", "--user", "agent:s3cret")
	if err := <-killed; err != nil {
		t.Fatalf("kill the registry mid-upload: %v (push: exit %d: %s)", err, code, out)
	}
	if code == 0 || !strings.Contains(out, "does not answer or broke off") {
		t.Fatalf("push through a registry killed mid-upload: exit %d:\n%s", code, out)
	}
	t.Logf("push interrupted: %s", out)
	noImage("an interrupted push")
	if err := reg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if reg.HasTag("branchbox/faults", "v1", "agent", "s3cret") {
		t.Fatal("the registry has the tag of an interrupted push")
	}
	// The retry works, and the tag is there.
	if out, code := push("sb", ref, "--plain-http", "--user", "agent:s3cret"); code != 0 {
		t.Fatalf("retry: exit %d: %s", code, out)
	}
	if !reg.HasTag("branchbox/faults", "v1", "agent", "s3cret") {
		t.Fatal("the registry has no tag after the retry")
	}

	// A pull on node B that the registry dies in the middle of (/big
	// being fetched) fails clearly and makes no sandbox; the retry does.
	ctxB, envB, clientB := shimEnv(t)
	collectGarbage(t, ctxB, clientB)
	beforeB := stateOf(t, ctxB, envB, clientB)
	pull := func() (string, int) {
		out, errOut, code := branchctl(t, ctx, envB, "", "pull", ref, "moved", "--plain-http", "--user", "agent:s3cret", "--", "sleep", "1000")
		return out + errOut, code
	}
	ingest := filepath.Join(envB.ContainerdRoot, "io.containerd.content.v1.content", "ingest")
	go func() {
		killed <- waitFile(ctx, ingest, "data", 1<<20, reg.Kill)
	}()
	out, code = pull()
	if err := <-killed; err != nil {
		t.Fatalf("kill the registry mid-download: %v (pull: exit %d: %s)", err, code, out)
	}
	if code == 0 || !strings.Contains(out, "does not answer or broke off") {
		t.Fatalf("pull from a registry killed mid-download: exit %d:\n%s", code, out)
	}
	t.Logf("pull interrupted: %s", out)
	if cs, err := clientB.Containers(ctx); err != nil || len(cs) != 0 {
		t.Fatalf("an interrupted pull left containers %v (%v)", cs, err)
	}
	if out, err := envB.Ctr(ctx, "images", "ls", "-q"); err != nil || strings.Contains(out, ref) {
		t.Fatalf("an interrupted pull left an image record: %q %v", out, err)
	}
	// Nor anything else: its partial download went with its lease.
	assertUnchanged(t, ctxB, envB, clientB, beforeB, "an interrupted pull")
	if err := reg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if out, code := pull(); code != 0 {
		t.Fatalf("retry of the pull: exit %d: %s", code, out)
	}
	t.Cleanup(func() { removeContainer(t, envB, "moved") })
	if _, err := envB.Ctr(ctx, "tasks", "start", "-d", "moved"); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, envB, "moved", "wc", "-c", "/big"); err != nil || !strings.HasPrefix(strings.TrimSpace(out), strconv.FormatInt(big, 10)) {
		t.Fatalf("the pulled sandbox's /big: %q %v", out, err)
	}
}

// waitFile waits until a file named name under dir holds more than n
// bytes, then calls fn; it gives up after a minute.
func waitFile(ctx context.Context, dir, name string, n int64, fn func() error) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		found := false
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && !found && d.Name() == name {
				if fi, err := d.Info(); err == nil && fi.Size() > n {
					found = true
				}
			}
			return nil
		})
		if found {
			return fn()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return fmt.Errorf("no file %s of more than %d bytes under %s within a minute", name, n, dir)
}

// TestRegistryPushKilled kills branchctl push with SIGKILL while it writes
// the change's 64 MB layer (8 MB under emulation; its two read-only mounts
// of the states are up): no
// mount of the sandbox's layers is left on the host, no image recorded, no
// tag in the registry; a retry works.
func TestRegistryPushKilled(t *testing.T) {
	reg := startRegistry(t, daemons.RegistryConfig{})
	ctx, env, _ := sandboxCtxEnv(t)
	// 64 MB that does not compress: the layer takes a while to write. Under
	// emulation 8 MB takes longer than that here, and the test's five
	// minutes hold two pushes of it.
	big := 64 << 20
	if daemons.Emulated() {
		big = 8 << 20
	}
	if out, err := execIn(ctx, env, "sb", "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /big", big)); err != nil {
		t.Fatalf("write %d bytes in the sandbox: %v: %s", big, err, out)
	}
	upper, err := env.RootfsUpperdir("sb")
	if err != nil {
		t.Fatal(err)
	}
	// Mounts on the host that name the sandbox's upper directory: its
	// rootfs, and any a push left.
	mountsOfUpper := func() int {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), upper)
	}
	before := mountsOfUpper()
	ref := reg.Ref("branchbox/killed:v1")
	cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "branchctl"), "push", "sb", ref, "--plain-http")
	// The (empty) directories its mounts were on stay when it is killed:
	// in a directory the test removes.
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), "CONTAINERD_ADDRESS="+env.Address, "CONTAINERD_NAMESPACE="+env.Namespace, "TMPDIR="+tmp, "XDG_RUNTIME_DIR="+tmp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The layer is being written once a thread of the push has a mount
	// namespace of its own (or once the host shows a mount of the states).
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	inLayer := func() bool {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/ns/mnt", cmd.Process.Pid))
		for _, ns := range tasks {
			if l, err := os.Readlink(ns); err == nil && l != self {
				return true
			}
		}
		return mountsOfUpper() > before
	}
	waitFor(t, inLayer)
	time.Sleep(200 * time.Millisecond)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if n := mountsOfUpper(); n != before {
		t.Fatalf("after the push was killed the host has %d mounts naming the sandbox's upper directory, before it %d", n, before)
	}
	if out, err := env.Ctr(ctx, "images", "ls", "-q"); err != nil || strings.Contains(out, ref) {
		t.Fatalf("after the push was killed: images %q (%v)", out, err)
	}
	if reg.HasTag("branchbox/killed", "v1", "", "") {
		t.Fatal("after the push was killed the registry has the tag")
	}
	if out, errOut, code := branchctl(t, ctx, env, "", "push", "sb", ref, "--plain-http"); code != 0 {
		t.Fatalf("retry after the kill: exit %d: %s%s", code, out, errOut)
	}
	if !reg.HasTag("branchbox/killed", "v1", "", "") {
		t.Fatal("the retry did not push the tag")
	}
}

// TestRegistrySaveLoad moves a branch without a registry: saved on node A
// as an OCI layout tar, loaded on node B into the branch snapshotter, run
// there as a sandbox that sees the branch's files and forks; loaded again
// as a sandbox (load FILE SANDBOX), as pull makes one.
func TestRegistrySaveLoad(t *testing.T) {
	ctx, envA, scA := sandboxCtxEnv(t)
	_, envB, _ := shimEnv(t)
	kids := fork(t, ctx, scA, client.ForkOptions{Count: 1})
	mustRun(t, ctx, scA, kids[0].ID, "sh", "-c", "echo saved > /data; rm /bin/true")
	file := t.TempDir() + "/sb.tar"
	if out, errOut, code := branchctl(t, ctx, envA, "", "save", "sb/"+kids[0].ID, file, "--name", "branchbox/moved:v1"); code != 0 {
		t.Fatalf("save: exit %d: %s%s", code, out, errOut)
	}
	if out, errOut, code := branchctl(t, ctx, envB, "", "load", file); code != 0 || !strings.Contains(out, "docker.io/branchbox/moved:v1") {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	if _, err := envB.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "docker.io/branchbox/moved:v1", "moved", "sh", "-c", "exec sleep 100000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, envB, "moved") })
	if out, err := execIn(ctx, envB, "moved", "sh", "-c", "cat /data /state; test -e /bin/true || echo no-true"); err != nil || out != "saved\nbefore\nno-true\n" {
		t.Fatalf("the loaded sandbox sees %q (%v)", out, err)
	}
	scB, err := client.NewSandboxClient(ctx, envB.Address, envB.Namespace, "moved")
	if err != nil {
		t.Fatal(err)
	}
	defer scB.Close()
	kidsB := fork(t, ctx, scB, client.ForkOptions{Count: 1})
	if got := mustRun(t, ctx, scB, kidsB[0].ID, "cat", "/data"); got != "saved\n" {
		t.Fatalf("a branch of the loaded sandbox reads %q", got)
	}
	// Loaded again as a sandbox, as pull makes one.
	out, errOut, code := branchctl(t, ctx, envB, "", "load", file, "moved2", "--json", "--", "sh", "-c", "exec sleep 100000")
	var made struct {
		Images  []string
		Sandbox string
	}
	if code != 0 || json.Unmarshal([]byte(out), &made) != nil || made.Sandbox != "moved2" || len(made.Images) != 1 || made.Images[0] != "docker.io/branchbox/moved:v1" {
		t.Fatalf("load as sandbox moved2: exit %d: %s%s", code, out, errOut)
	}
	t.Cleanup(func() { removeContainer(t, envB, "moved2") })
	if _, err := envB.Ctr(ctx, "tasks", "start", "-d", "moved2"); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, envB, "moved2", "cat", "/data"); err != nil || out != "saved\n" {
		t.Fatalf("the sandbox loaded reads %q (%v)", out, err)
	}
	if _, errOut, code := branchctl(t, ctx, envB, "", "load", file, "moved2"); code == 0 || !strings.Contains(errOut, "exists already") {
		t.Fatalf("load as a sandbox of a name taken: exit %d: %s", code, errOut)
	}
	// A missing file and a file that is no archive fail clearly.
	if _, errOut, code := branchctl(t, ctx, envB, "", "load", file+".nope"); code == 0 || !strings.Contains(errOut, "no such file") {
		t.Fatalf("load of a missing file: exit %d: %s", code, errOut)
	}
	if _, errOut, code := branchctl(t, ctx, envA, "", "save", "sb/77", file); code == 0 || !strings.Contains(errOut, "no branch 77") {
		t.Fatalf("save of an unknown branch: exit %d: %s", code, errOut)
	}
}

// TestRegistryPushCheckpoints pushes a sandbox with two checkpoints: its
// image holds one layer per checkpoint on the path and one for the change
// since the last, the lineage names them; pushing SANDBOX@CHECKPOINT then
// makes the same checkpoint layer (the registry receives only a config and
// a manifest). Node B runs both images: the first equals the sandbox now
// file by file, the second the checkpoint's state.
func TestRegistryPushCheckpoints(t *testing.T) {
	reg := startRegistry(t, daemons.RegistryConfig{})
	ctx, envA, _ := sandboxCtxEnv(t)
	_, envB, _ := shimEnv(t)
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
	sh("echo one > /state; mkdir /w; echo a > /w/a")
	ctl(envA, "checkpoint", "sb", "first")
	sh("echo two > /state; rm /w/a; echo b > /w/b")
	ctl(envA, "checkpoint", "sb", "second")
	sh("echo three > /state; echo c > /w/c")

	type layersOut struct {
		pushOut
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
		Checkpoints []struct {
			Name  string `json:"name"`
			Layer string `json:"layer"`
		} `json:"checkpoints"`
	}
	var now layersOut
	if err := json.Unmarshal([]byte(ctl(envA, "push", "sb", reg.Ref("branchbox/ck:now"), "--plain-http", "--json")), &now); err != nil {
		t.Fatal(err)
	}
	if len(now.Layers) != 4 || len(now.Checkpoints) != 2 || now.Checkpoints[0].Name != "first" || now.Checkpoints[1].Name != "second" ||
		now.Checkpoints[0].Layer != now.Layers[1].Digest || now.Checkpoints[1].Layer != now.Layers[2].Digest || now.Change.Digest != now.Layers[3].Digest {
		t.Fatalf("push of a sandbox with two checkpoints: want the base layer, one per checkpoint and the change: %+v", now)
	}
	var first layersOut
	if err := json.Unmarshal([]byte(ctl(envA, "push", "sb@first", reg.Ref("branchbox/ck:first"), "--plain-http", "--json")), &first); err != nil {
		t.Fatal(err)
	}
	if len(first.Layers) != 2 || first.Layers[1].Digest != now.Layers[1].Digest {
		t.Fatalf("push of checkpoint first: layers %+v, want the base and checkpoint first's layer %s", first.Layers, now.Layers[1].Digest)
	}
	if first.SentBlobs != 2 || first.SkippedBlobs != 2 {
		t.Fatalf("push of checkpoint first after the sandbox sent %d blobs and skipped %d; want 2 (config, manifest) and 2 (both layers)", first.SentBlobs, first.SkippedBlobs)
	}
	if _, errOut, code := branchctl(t, ctx, envA, "", "push", "sb@nope", reg.Ref("branchbox/ck:nope"), "--plain-http"); code == 0 || !strings.Contains(errOut, `no checkpoint "nope"`) {
		t.Fatalf("push of an unknown checkpoint: exit %d: %s", code, errOut)
	}

	// Node B runs both; each equals its state on A.
	bc, rootA := snapshotterRoot(t, envA, "sb")
	defer bc.Close()
	sbRef := branch.Ref{Root: rootA}
	for _, c := range []struct{ tag, id, ck, want string }{
		{"now", "bnow", "", "three\nb\nc\n"},
		{"first", "bfirst", "first", "one\na\n"},
	} {
		ref := reg.Ref("branchbox/ck:" + c.tag)
		if _, err := envB.Ctr(ctx, "images", "pull", "--plain-http", "--snapshotter", "branch", ref); err != nil {
			t.Fatal(err)
		}
		if _, err := envB.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", ref, c.id, "sh", "-c", "exec sleep 100000"); err != nil {
			t.Fatal(err)
		}
		id := c.id
		t.Cleanup(func() { removeContainer(t, envB, id) })
		if out, err := execIn(ctx, envB, c.id, "sh", "-c", "cat /state; cat /w/*"); err != nil || out != c.want {
			t.Fatalf("%s on node B reads %q (%v), want %q", c.tag, out, err, c.want)
		}
		var ms []mount.Mount
		var err error
		if c.ck == "" {
			ms, err = bc.Mounts(ctx, sbRef)
		} else {
			ms, err = bc.CheckpointMounts(ctx, sbRef, c.ck)
		}
		if err != nil {
			t.Fatal(err)
		}
		rootfsB := envB.ContainerdState + "/io.containerd.runtime.v2.task/" + envB.Namespace + "/" + c.id + "/rootfs"
		if err := mount.WithReadonlyTempMount(ctx, ms, func(rootA string) error { return compareAsLayers(rootA, rootfsB) }); err != nil {
			t.Fatalf("%s: %v", c.tag, err)
		}
	}

	// branchctl pull on B restores the checkpoints on the path as named
	// checkpoints of the new sandbox: rollback and fork --from work there.
	var pulled struct {
		Sandbox     string   `json:"sandbox"`
		Checkpoints []string `json:"checkpoints"`
	}
	if err := json.Unmarshal([]byte(ctl(envB, "pull", reg.Ref("branchbox/ck:now"), "restored", "--plain-http", "--json", "--", "sh", "-c", "exec sleep 100000")), &pulled); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, envB, "restored") })
	if pulled.Sandbox != "restored" || strings.Join(pulled.Checkpoints, ",") != "first,second" {
		t.Fatalf("pull made %+v, want sandbox restored with checkpoints first, second", pulled)
	}
	if _, err := envB.Ctr(ctx, "tasks", "start", "-d", "restored"); err != nil {
		t.Fatal(err)
	}
	readB := func(id string) string {
		out, err := execIn(ctx, envB, id, "sh", "-c", "cat /state; cat /w/*")
		if err != nil {
			t.Fatalf("read on node B: %v: %s", err, out)
		}
		return out
	}
	if got := readB("restored"); got != "three\nb\nc\n" {
		t.Fatalf("the pulled sandbox reads %q, want the pushed state", got)
	}
	out := ctl(envB, "checkpoint", "ls", "restored")
	for _, want := range []string{"first", "second *"} {
		if !strings.Contains(out, want) {
			t.Fatalf("checkpoints of the pulled sandbox: no %q in\n%s", want, out)
		}
	}
	scR, err := client.NewSandboxClient(ctx, envB.Address, envB.Namespace, "restored")
	if err != nil {
		t.Fatal(err)
	}
	defer scR.Close()
	kid := fork(t, ctx, scR, client.ForkOptions{Count: 1, From: "second"})[0]
	if got := mustRun(t, ctx, scR, kid.ID, "sh", "-c", "cat /state; cat /w/*"); got != "two\nb\n" {
		t.Fatalf("fork --from second on node B reads %q", got)
	}
	if _, err := scR.Abort(ctx, kid.ID); err != nil {
		t.Fatal(err)
	}
	ctl(envB, "rollback", "restored", "first")
	if got := readB("restored"); got != "one\na\n" {
		t.Fatalf("rollback to first on node B reads %q, want A's state at first", got)
	}
	ctl(envB, "rollback", "restored", "second")
	if got := readB("restored"); got != "two\nb\n" {
		t.Fatalf("rollback to second on node B reads %q, want A's state at second", got)
	}

	// A branch's path starts with its parent's: sb's checkpoints up to
	// its head (second), then the branch's own (mine), then its change.
	scA, err := client.NewSandboxClient(ctx, envA.Address, envA.Namespace, "sb")
	if err != nil {
		t.Fatal(err)
	}
	defer scA.Close()
	b := fork(t, ctx, scA, client.ForkOptions{Count: 1})[0].ID
	mustRun(t, ctx, scA, b, "sh", "-c", "echo four > /state; echo d > /w/d")
	ctl(envA, "checkpoint", "sb/"+b, "mine")
	mustRun(t, ctx, scA, b, "sh", "-c", "echo five > /state; rm /w/b")
	var br layersOut
	if err := json.Unmarshal([]byte(ctl(envA, "push", "sb/"+b, reg.Ref("branchbox/ck:branch"), "--plain-http", "--json")), &br); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ck := range br.Checkpoints {
		names = append(names, ck.Name)
	}
	if len(br.Layers) != 5 || strings.Join(names, ",") != "first,second,mine" || br.Checkpoints[0].Layer != now.Layers[1].Digest {
		t.Fatalf("push of a branch of a sandbox with checkpoints: want the base layer, sb's first and second (as before), the branch's mine and its change: %+v", br)
	}
	if err := json.Unmarshal([]byte(ctl(envB, "pull", reg.Ref("branchbox/ck:branch"), "restoredb", "--plain-http", "--json", "--", "sh", "-c", "exec sleep 100000")), &pulled); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, envB, "restoredb") })
	if strings.Join(pulled.Checkpoints, ",") != "first,second,mine" {
		t.Fatalf("pull of the branch restored checkpoints %v, want first, second, mine", pulled.Checkpoints)
	}
	if _, err := envB.Ctr(ctx, "tasks", "start", "-d", "restoredb"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ck, want string }{{"", "five\nc\nd\n"}, {"mine", "four\nb\nc\nd\n"}, {"first", "one\na\n"}} {
		if c.ck != "" {
			ctl(envB, "rollback", "restoredb", c.ck)
		}
		if got := readB("restoredb"); got != c.want {
			t.Fatalf("the pulled branch at %q reads %q, want A's branch's state there %q", c.ck, got, c.want)
		}
	}
}

// TestRegistryCRIPod runs a pushed sandbox as a Kubernetes pod would on
// node B: the image pulled as a kubelet pulls (into containerd's CRI
// namespace and default snapshotter), a pod on RuntimeClass handler
// branch, a container of that image that sees the pushed change, and a
// fork of it.
func TestRegistryCRIPod(t *testing.T) {
	reg := startRegistry(t, daemons.RegistryConfig{})
	ctx, envA, _ := sandboxCtxEnv(t)
	if out, err := execIn(ctx, envA, "sb", "sh", "-c", "echo pushed > /data"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ref := reg.Ref("branchbox/cri:v1")
	if out, errOut, code := branchctl(t, ctx, envA, "", "push", "sb", ref, "--plain-http"); code != 0 {
		t.Fatalf("push: exit %d: %s%s", code, out, errOut)
	}

	c := criEnv(t)
	if _, err := c.env.CtrIn(c.ctx, daemons.CRINamespace, "images", "pull", "--plain-http", "--snapshotter", "overlayfs", ref); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the CRI plugin to see "+ref, 10*time.Second, func() bool {
		_, err := c.env.Crictl(c.ctx, "inspecti", ref)
		return err == nil
	})
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("moved", "branch", ns)
	cfg := c.writeJSON("moved-container.json", map[string]any{
		"metadata": map[string]any{"name": "app", "attempt": 0},
		"image":    map[string]any{"image": ref},
		"command":  []string{"/bin/sh", "-c", "exec sleep 1000"},
		"log_path": "app.log",
		"linux":    map[string]any{"security_context": map[string]any{"namespace_options": ns.options()}},
	})
	out, err := c.env.Crictl(c.ctx, "create", pod, cfg, podCfg)
	if err != nil {
		t.Fatal(err)
	}
	ctr := lastLine(out)
	c.ids = append(c.ids, ctr)
	if _, err := c.env.Crictl(c.ctx, "start", ctr); err != nil {
		t.Fatal(err)
	}
	if out, err := c.env.Crictl(c.ctx, "exec", "-s", ctr, "cat", "/data", "/state"); err != nil || strings.TrimSpace(out) != "pushed\nbefore" {
		t.Fatalf("the pod's container reads %q (%v), want the pushed sandbox's files", out, err)
	}
	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	kids := fork(t, c.ctx, sc, client.ForkOptions{Count: 1})
	if got := mustRun(t, c.ctx, sc, kids[0].ID, "cat", "/data"); got != "pushed\n" {
		t.Fatalf("a branch of the pod's container reads %q", got)
	}
	if _, err := sc.Abort(c.ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
}
