//go:build linux

package integration

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestCheckpointBounds: a sandbox's checkpoints are bounded in number and
// in the bytes they hold in the snapshotter's root, wherever they are
// asked for. Before, a sandbox with the branch socket made 300
// checkpoints of a 20 MB file it appended to in 12 seconds: 5.9 GB of the
// node's disk. (a) The node's count (BRANCHBOX_MAX_CHECKPOINTS): from
// inside and from the host, with and without memory, the next is refused
// naming the bound, until one is deleted (self checkpoint rm, which finds
// only the caller's own). (b) The annotation's bytes: a sandbox writing 3
// MB between checkpoints is refused before its checkpoints pass 8 MiB,
// and no refused layer stays on disk. (c) Checkpoints and rollbacks from
// inside take from the fork rate's bucket. A bad annotation fails the create.
func TestCheckpointBounds(t *testing.T) {
	ctx, env, _ := shimEnvWith(t, daemons.Config{ContainerdEnv: []string{"BRANCHBOX_MAX_CHECKPOINTS=4"}})
	importInsockImage(t, ctx, env)
	in := func(id string, args ...string) (string, error) { return execIn(ctx, env, id, args...) }
	must := func(id string, args ...string) string {
		t.Helper()
		out, err := in(id, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	refused := func(err error, out string, want ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("not refused: %q", out)
		}
		for _, w := range append(want, "resource exhausted") {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("refusal %v\nwant it to say %q", err, w)
			}
		}
	}

	args := []string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch", "--annotation", "io.branchbox.max-checkpoint-bytes=1000", insockImage, "bad", "true"}
	if _, err := env.Ctr(ctx, args...); err == nil || !strings.Contains(err.Error(), "io.branchbox.max-checkpoint-bytes") || !strings.Contains(err.Error(), "invalid argument") {
		t.Fatalf("create with max-checkpoint-bytes=1000: %v", err)
	}
	removeContainer(t, env, "bad")

	// (a) The node's count, 4: three from inside (one of a branch), one
	// from the host.
	runBoundedSandbox(t, ctx, env, "count")
	kid := strings.TrimSpace(must("count", "branchctl", "self", "fork", "-n", "1"))
	must("count", "branchctl", "self", "checkpoint", "c1")
	must("count", "branchctl", "self", "checkpoint", "c2")
	must("count", "branchctl", "self", "checkpoint", "--branch", kid, "k1")
	if out, errOut, code := branchctl(t, ctx, env, "", "checkpoint", "count", "c3"); code != 0 {
		t.Fatalf("host checkpoint c3: %s %s", out, errOut)
	}
	const countWords = "it has 4 checkpoints, its maximum (set for the node by BRANCHBOX_MAX_CHECKPOINTS"
	out, err := in("count", "branchctl", "self", "checkpoint", "c4")
	refused(err, out, countWords, "delete some first (branchctl self checkpoint rm NAME)")
	if out, errOut, code := branchctl(t, ctx, env, "", "checkpoint", "count", "c4"); code == 0 || !strings.Contains(errOut, countWords) || !strings.Contains(errOut, "sets it per sandbox): delete some first (branchctl checkpoint rm count NAME)") {
		t.Fatalf("host checkpoint past the count: %d %q %q", code, out, errOut)
	}
	// The Go client gets the refusal typed, the shim's words and the
	// figures (the HTTP API and MCP tell a bound from a full disk by it).
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "count")
	if err != nil {
		t.Fatal(err)
	}
	_, err = sc.Checkpoint(ctx, "0", "c4")
	sc.Close()
	var be *branch.CheckpointBoundError
	if !errors.As(err, &be) || be.Count != 4 || be.MaxCheckpoints != 4 || !strings.Contains(err.Error(), countWords) || !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Go client's checkpoint past the count: %#v (%v)", err, err)
	}
	// With memory: refused before its processes are dumped.
	if out, errOut, code := branchctl(t, ctx, env, "", "checkpoint", "count", "m1", "--memory"); code == 0 || !strings.Contains(errOut, countWords) {
		t.Fatalf("host checkpoint --memory past the count: %d %q %q", code, out, errOut)
	}
	if list := must("count", "branchctl", "self", "checkpoint", "ls"); strings.Count(list, "\n") != 5 {
		t.Fatalf("checkpoints after the refusals:\n%s", list)
	}
	// The branch deletes only its own (and its descendants'): c1, not
	// another branch's, which it does not see.
	if out, err := in("count", "branchctl", "self", "checkpoint", "rm", "nope"); err == nil || !strings.Contains(err.Error(), "not found") || !strings.Contains(err.Error(), "hint: see this branch's descendants and checkpoints with `branchctl self tree`") {
		t.Fatalf("self checkpoint rm of no checkpoint: %q %v", out, err)
	}
	if out, err := in("count", "branchctl", "self", "exec", kid, "--", "branchctl", "self", "checkpoint", "rm", "c1"); err == nil || !strings.Contains(err.Error()+out, "not found") {
		t.Fatalf("branch %s deleting the sandbox's checkpoint c1: %q %v", kid, out, err)
	}
	must("count", "branchctl", "self", "checkpoint", "rm", "c1")
	must("count", "branchctl", "self", "checkpoint", "c4")

	// (b) At most 8 MiB, by the annotation; 3 MB written between
	// checkpoints.
	runBoundedSandbox(t, ctx, env, "bytes", "io.branchbox.max-checkpoint-bytes=8MiB")
	made := 0
	for i := 1; ; i++ {
		if i > 4 {
			t.Fatal("4 checkpoints of 3 MB each within 8 MiB")
		}
		// The pause keeps the file's ctime out of the two clock ticks
		// after which a checkpoint takes it again as changed.
		must("bytes", "sh", "-c", "dd if=/dev/urandom of=/f"+strconv.Itoa(i)+" bs=1M count=3 2>/dev/null && sleep 0.1")
		out, err := in("bytes", "branchctl", "self", "checkpoint", "b"+strconv.Itoa(i))
		if err != nil {
			refused(err, out, "would take them past their maximum of 8MiB (annotation io.branchbox.max-checkpoint-bytes)")
			break
		}
		made++
	}
	if made < 2 {
		t.Fatalf("only %d checkpoints of 3 MB each within 8 MiB", made)
	}
	var held int64
	if err := filepath.WalkDir(filepath.Join(env.SnapshotterRoot, "checkpoints"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), "new-") {
			t.Errorf("a checkpoint layer being written is left: %s", p)
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			held += fi.Size()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Both sandboxes' layers with their manifests: (a)'s are small.
	if held > 9<<20 {
		t.Fatalf("checkpoints hold %d bytes on disk, want at most 8 MiB and their manifests", held)
	}

	// (c) Checkpoints and rollbacks from inside take from the bucket of
	// the fork rate.
	runBoundedSandbox(t, ctx, env, "slow", "io.branchbox.fork-rate=0.1", "io.branchbox.max-branches=2")
	must("slow", "branchctl", "self", "checkpoint", "s1")
	must("slow", "branchctl", "self", "checkpoint", "s2")
	out, err = in("slow", "branchctl", "self", "checkpoint", "s3")
	refused(err, out, "makes from inside at most 0.1 branches, checkpoints and rollbacks a second (annotation io.branchbox.fork-rate), and this checkpoint would wait")
	out, err = in("slow", "branchctl", "self", "rollback", "s1")
	refused(err, out, "and this rollback would wait")
	if out, errOut, code := branchctl(t, ctx, env, "", "checkpoint", "slow", "s3"); code != 0 {
		t.Fatalf("host checkpoint of a sandbox over its rate (the host is not rate-limited): %s %s", out, errOut)
	}
}
