//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// TestMemoryCheckpoint takes a checkpoint of a running sandbox with its
// processes, lets the sandbox go on, and later forks branches from that
// checkpoint with memory: each branch's REPL continues from the state at
// the checkpoint (its variables, its command counter, the file it appends
// to as it was then), not from the sandbox's state at the fork.
func TestMemoryCheckpoint(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=at-ck; echo at-ck >&3`)
	// The tmpfs mounts' content is part of the instant, whoever copies it
	// (tmpfs.go in shim/ocirt: the small ones, the runtime).
	if out, err := execIn(ctx, env, "sb", "sh", "-c", `echo shm-at-ck > /dev/shm/x && chmod 640 /dev/shm/x && ln /dev/shm/x /dev/shm/hard && mkdir -p /run/d && ln -s ../../dev/shm/x /run/d/link && mkfifo /run/d/fifo`); err != nil {
		t.Fatalf("write the sandbox's tmpfs mounts: %v: %s", err, out)
	}
	mi, err := execIn(ctx, env, "sb", "cat", "/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	tmpfsBefore := tmpfsMounts(t, mi)
	ck, err := sc.Checkpoint(ctx, "", "warm", client.CheckpointWithMemory())
	if err != nil {
		t.Fatalf("checkpoint with memory: %v", err)
	}
	if ck.MemoryBytes == 0 {
		t.Fatalf("checkpoint %+v holds no memory image", ck)
	}
	// The sandbox was only paused: it goes on, and changes its files.
	if got := replIn(t, ctx, env, sc, branch.RootID, 1, `mem=later; echo later >&3; echo $mem`); got != "later\n" {
		t.Fatalf("sandbox after the checkpoint: %q", got)
	}
	if _, err := sc.Checkpoint(ctx, "", "files"); err != nil {
		t.Fatal(err)
	}
	list, err := sc.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var memDir string
	for _, c := range list {
		switch c.Name {
		case "warm":
			memDir = c.MemoryDir
			if c.MemoryBytes != ck.MemoryBytes || memDir == "" {
				t.Fatalf("listed %+v, want %d bytes of memory", c, ck.MemoryBytes)
			}
		case "files":
			if c.MemoryBytes != 0 {
				t.Fatalf("checkpoint without memory lists %d bytes of it", c.MemoryBytes)
			}
		}
	}
	if _, err := os.Stat(memDir); err != nil {
		t.Fatalf("the memory image is not kept with the checkpoint: %v", err)
	}
	// The container's small tmpfs mounts were copied by the runtime, not
	// archived by CRIU's tar.
	if _, err := os.Stat(filepath.Join(memDir, "branchbox-tmpfs.json")); err != nil {
		t.Fatalf("no tmpfs copies in the image: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(memDir, "tmpfs-dev-*")); len(left) > 0 {
		idx, _ := os.ReadFile(filepath.Join(memDir, "branchbox-tmpfs.json"))
		t.Fatalf("CRIU archived tmpfs mounts the runtime copies: %v (copied: %s; the sandbox's: %s)", left, idx, mi)
	}
	// A checkpoint of files only has no processes to fork.
	if _, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, From: "files", WithMemory: true}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("fork --from a files-only checkpoint with memory: %v; want failed precondition", err)
	}
	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 2, From: "warm", WithMemory: true})
	if err != nil {
		t.Fatalf("fork --from warm with memory: %v", err)
	}
	if len(res.Branches) != 2 || res.Memory == nil || res.Memory.ImageBytes != ck.MemoryBytes {
		t.Fatalf("fork --from warm: %+v, figures %+v", res.Branches, res.Memory)
	}
	for _, k := range res.Branches {
		if !k.MemoryFork {
			t.Fatalf("branch %s is not a memory branch", k.ID)
		}
		if got := replIn(t, ctx, env, sc, k.ID, 1, `echo "mem=$mem k=$k"`); got != "mem=at-ck k=1\n" {
			t.Fatalf("branch %s continues with %q, want the checkpoint's state (mem=at-ck k=1)", k.ID, got)
		}
		if got := mustRun(t, ctx, sc, k.ID, "cat", "/data.log"); got != "before\nat-ck\n" {
			t.Fatalf("branch %s: /data.log %q, want the checkpoint's", k.ID, got)
		}
		want := "shm-at-ck\nshm-at-ck\n640 2\nlink:../../dev/shm/x fifo\n"
		if got := mustRun(t, ctx, sc, k.ID, "sh", "-c", `cat /dev/shm/x /run/d/link; stat -c '%a %h' /dev/shm/x; echo link:$(readlink /run/d/link) $([ -p /run/d/fifo ] && echo fifo)`); got != want {
			t.Fatalf("branch %s: its tmpfs content %q, want the checkpoint's %q", k.ID, got, want)
		}
		if got := tmpfsMounts(t, mustRun(t, ctx, sc, k.ID, "cat", "/proc/self/mountinfo")); !reflect.DeepEqual(got, tmpfsBefore) {
			t.Fatalf("branch %s: tmpfs mounts %v, want the sandbox's %v", k.ID, got, tmpfsBefore)
		}
	}
	a, b := res.Branches[0], res.Branches[1]
	replIn(t, ctx, env, sc, a.ID, 2, `echo from-a >&3`)
	if err := sc.DeleteCheckpoint(ctx, "warm"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete a checkpoint branches are forked from: %v; want failed precondition", err)
	}
	loser := branchProcs(env, b)
	if _, err := sc.Commit(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	assertBranchGone(t, env, b, loser)
	// The commit of a branch forked from a checkpoint brings the parent to
	// that checkpoint's files plus the winner's change.
	if out, err := execIn(ctx, env, "sb", "cat", "/data.log"); err != nil || out != "before\nat-ck\nfrom-a\n" {
		t.Fatalf("sandbox's /data.log after the commit: %q %v", out, err)
	}
	if err := sc.DeleteCheckpoint(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(memDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("memory image of a deleted checkpoint: %v; want it removed", err)
	}
	assertNoMemoryImages(t, env)
}

// TestMemoryCheckpointRefusals: a checkpoint with memory refuses what a
// memory fork refuses, before anything is recorded.
func TestMemoryCheckpointRefusals(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `nc -l -p 8124 >/dev/null 2>&1 & echo started`)
	waitUntil(t, "the listener", 10*time.Second, func() bool {
		_, err := sc.Checkpoint(ctx, "", "x", client.CheckpointWithMemory())
		return errdefs.IsFailedPrecondition(err)
	})
	list, err := sc.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Fatalf("a refused checkpoint left %v", list)
	}
	// The sandbox was not left frozen.
	if got := replIn(t, ctx, env, sc, branch.RootID, 1, `echo alive`); got != "alive\n" {
		t.Fatalf("sandbox after a refused checkpoint: %q", got)
	}
}

// TestMemoryRollback rolls a memory branch back to a checkpoint taken with
// its processes: the processes it runs now are killed and the
// checkpoint's are restored, with the checkpoint's files, so its REPL is
// where it was (its variables, its command counter, its open file's
// contents).
func TestMemoryRollback(t *testing.T) {
	ctx, env, sc := replSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=root`)
	kids, err := sc.Fork(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	a := kids[0]
	replIn(t, ctx, env, sc, a.ID, 1, `mem=saved; echo saved >&3`)
	if _, err := sc.Checkpoint(ctx, a.ID, "s1", client.CheckpointWithMemory()); err != nil {
		t.Fatalf("checkpoint of a memory branch with memory: %v", err)
	}
	if got := replIn(t, ctx, env, sc, a.ID, 2, `mem=changed; echo changed >&3; echo $mem`); got != "changed\n" {
		t.Fatalf("branch after its checkpoint: %q", got)
	}
	before := branchProcs(env, a)
	if len(before) == 0 {
		t.Fatal("the branch's processes are not seen from the host")
	}
	if err := sc.Rollback(ctx, a.ID, "s1"); err != nil {
		t.Fatalf("rollback of a memory branch to a checkpoint with memory: %v", err)
	}
	for _, p := range before {
		if procAlive(p) {
			t.Fatalf("process %v of the branch before the rollback still runs", p)
		}
	}
	if got := replIn(t, ctx, env, sc, a.ID, 2, `echo "mem=$mem k=$k"`); got != "mem=saved k=2\n" {
		t.Fatalf("branch after the rollback continues with %q, want the checkpoint's state (mem=saved k=2)", got)
	}
	if got := mustRun(t, ctx, sc, a.ID, "cat", "/data.log"); got != "before\nsaved\n" {
		t.Fatalf("branch after the rollback: /data.log %q, want the checkpoint's", got)
	}
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range tree {
		if n.ID == a.ID && (n.Status != "running" || !n.MemoryFork) {
			t.Fatalf("branch after the rollback: %+v", n)
		}
	}
	// Again, from a state that moved on: as often as asked, each time to
	// the checkpoint (the old init's teardown must not take the new
	// rootfs mount with it).
	replIn(t, ctx, env, sc, a.ID, 3, `mem=second; echo second >&3`)
	if err := sc.Rollback(ctx, a.ID, "s1"); err != nil {
		t.Fatalf("second rollback: %v", err)
	}
	if got := replIn(t, ctx, env, sc, a.ID, 2, `echo "mem=$mem k=$k"`); got != "mem=saved k=2\n" {
		t.Fatalf("branch after the second rollback continues with %q, want mem=saved k=2", got)
	}
	// Its processes go on from there, and are committed as any branch's.
	replIn(t, ctx, env, sc, a.ID, 3, `echo again >&3`)
	if _, err := sc.Commit(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/data.log"); err != nil || out != "before\nsaved\nagain\n" {
		t.Fatalf("sandbox's /data.log after the commit: %q %v", out, err)
	}
	if _, err := sc.Checkpoint(ctx, "", "root-mem", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	replIn(t, ctx, env, sc, branch.RootID, 1, `mem=moved`)
	// The sandbox itself is rolled back with its processes too
	// (TestMemoryRollbackSandbox has the rest).
	if err := sc.Rollback(ctx, "", "root-mem"); err != nil {
		t.Fatalf("rollback of the sandbox to a checkpoint with memory: %v", err)
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 1, `echo $mem`); got != "root\n" {
		t.Fatalf("sandbox after its rollback: %q, want the checkpoint's mem=root", got)
	}
	assertNoMemoryImages(t, env)
}

// procAlive says whether p (its pid and start time) still runs.
func procAlive(p hostProc) bool {
	start, ok := procStart(p.pid)
	return ok && start == p.start
}

// TestMemoryCheckpointPushPull pushes a checkpoint taken with memory to a
// real registry and pulls it on another node (its own containerd,
// snapshotter and shims), where a branch forked from it with memory
// continues the REPL from the checkpoint. containerd's own pull of the
// same tag gets the runnable image and skips the memory image.
func TestMemoryCheckpointPushPull(t *testing.T) {
	reg := startRegistry(t, daemons.RegistryConfig{})
	ctx, envA, sc := replSandbox(t)
	_, envB, _ := shimEnv(t)
	replIn(t, ctx, envA, sc, branch.RootID, 0, `mem=pushed; echo pushed >&3`)
	ck, err := sc.Checkpoint(ctx, "", "warm", client.CheckpointWithMemory())
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Ref("branchbox/mem:v1")
	out, errOut, code := branchctl(t, ctx, envA, "", "push", "sb@warm", ref, "--plain-http", "--json")
	if code != 0 {
		t.Fatalf("push: exit %d: %s%s", code, out, errOut)
	}
	var pushed struct {
		Root, Manifest string
		Checkpoints    []struct{ Name, Layer, Memory string }
	}
	if err := json.Unmarshal([]byte(out), &pushed); err != nil {
		t.Fatal(err)
	}
	if pushed.Root == pushed.Manifest || len(pushed.Checkpoints) != 1 || pushed.Checkpoints[0].Memory == "" {
		t.Fatalf("push of a checkpoint with memory: %s; want an index holding its memory image", out)
	}
	if _, err := envB.Ctr(ctx, "images", "pull", "--plain-http", "--snapshotter", "branch", ref); err != nil {
		t.Fatalf("containerd's pull of an image with a memory image beside it: %v", err)
	}
	if _, err := envB.Ctr(ctx, "images", "rm", ref); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = branchctl(t, ctx, envB, "", "pull", ref, "sb2", "--plain-http", "--", "sh", "-c", replScript)
	if code != 0 {
		t.Fatalf("pull: exit %d: %s%s", code, out, errOut)
	}
	t.Cleanup(func() { removeContainer(t, envB, "sb2") })
	if _, err := envB.Ctr(ctx, "tasks", "start", "-d", "sb2"); err != nil {
		t.Fatal(err)
	}
	waitReplReady(t, ctx, envB, "sb2")
	scB, err := client.NewSandboxClient(ctx, envB.Address, envB.Namespace, "sb2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { scB.Close() })
	list, err := scB.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "warm" || list[0].MemoryBytes != ck.MemoryBytes {
		t.Fatalf("pulled checkpoints %+v, want warm with %d bytes of memory", list, ck.MemoryBytes)
	}
	kids, err := scB.Fork(ctx, client.ForkOptions{Count: 1, From: "warm", WithMemory: true})
	if err != nil {
		t.Fatalf("fork --from a pulled checkpoint with memory: %v", err)
	}
	if got := replIn(t, ctx, envB, scB, kids[0].ID, 1, `echo "mem=$mem k=$k"`); got != "mem=pushed k=1\n" {
		t.Fatalf("branch of the pulled checkpoint continues with %q, want mem=pushed k=1", got)
	}
	if got := mustRun(t, ctx, scB, kids[0].ID, "cat", "/data.log"); got != "before\npushed\n" {
		t.Fatalf("branch of the pulled checkpoint: /data.log %q", got)
	}
	if _, err := scB.Abort(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryCheckpointSelfFork: from inside the sandbox, through its
// branch socket, a fork --from a checkpoint taken with memory restores the
// checkpoint's processes into the branch (the image holds no caller); a
// memory fork of the live sandbox asked for by a process exec'd into it is
// refused, naming it.
func TestMemoryCheckpointSelfFork(t *testing.T) {
	ctx, env, sc := insockReplSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=inside`)
	if _, err := sc.Checkpoint(ctx, "", "warm", client.CheckpointWithMemory()); err != nil {
		t.Fatal(err)
	}
	// A live memory fork asked for by a process exec'd into the sandbox
	// (not of the init's tree, which is what a memory fork copies) is
	// refused, naming it; TestMemorySelfForkLive asks from the tree.
	if out, err := execIn(ctx, env, "sb", "branchctl", "self", "fork", "--memory"); err == nil || !strings.Contains(out+err.Error(), "(branchctl) was exec'd into it") {
		t.Fatalf("memory fork of the live sandbox by an exec'd process: %q %v; want refused, naming it", out, err)
	}
	out, err := execIn(ctx, env, "sb", "branchctl", "self", "fork", "--from", "warm", "--memory", "--json")
	if err != nil {
		t.Fatalf("self fork --from warm --memory: %v: %s", err, out)
	}
	var kids []client.BranchInfo
	if err := json.Unmarshal([]byte(out), &kids); err != nil || len(kids) != 1 {
		t.Fatalf("self fork --from warm --memory printed %q: %v", out, err)
	}
	if got := replIn(t, ctx, env, sc, kids[0].ID, 1, `echo "mem=$mem k=$k"`); got != "mem=inside k=1\n" {
		t.Fatalf("branch forked from inside continues with %q, want mem=inside k=1", got)
	}
}

// TestMemorySelfForkLive: a process of the sandbox's tree asks for a memory
// fork of its own sandbox through the branch socket (branchctl self fork
// --memory, run by the REPL) and the call returns twice, as fork(2) does:
// in the sandbox with the new branches, in each copy with none, each copy
// continuing from the same state (the REPL's variable) and talking to its
// own branch's socket afterwards.
func TestMemorySelfForkLive(t *testing.T) {
	ctx, env, sc := insockReplSandbox(t)
	// A refusal comes back to the caller too, through the outcome: here
	// a listener, which the copies could not bind beside the sandbox's.
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=live; nc -l -p 8126 >/dev/null 2>&1 & ncpid=$!; echo started`)
	waitUntil(t, "the listener", 10*time.Second, func() bool {
		_, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
		return err != nil && strings.Contains(err.Error(), "listens on TCP port 8126")
	})
	root := branchInitPid(t, ctx, sc, branch.RootID)
	if got := replVia(t, root, 1, `out=$(branchctl self fork --memory 2>&1); echo "rc=$? $out"; kill $ncpid; wait $ncpid`); !strings.HasPrefix(got, "rc=1 ") || !strings.Contains(got, "listens on TCP port 8126") {
		t.Fatalf("self fork --memory with a listener printed %q; want rc=1 naming the listener", got)
	}
	out := replVia(t, root, 2, `ids=$(branchctl self fork --memory -n 2 2>&1); echo "rc=$? ids=[$(echo $ids)] mem=$mem"`)
	var a, b string
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "rc=0 ids=[%s %s", &a, &b); err != nil || !strings.HasSuffix(out, "] mem=live\n") {
		t.Fatalf("self fork --memory in the sandbox printed %q (%v); want rc=0, two branch ids, mem=live", out, err)
	}
	b = strings.TrimSuffix(b, "]")
	for _, k := range []string{a, b} {
		// The copy's call returned with no branch, its state the sandbox's.
		if got := copyOutput(t, ctx, sc, k, 2, "fork"); got != "rc=0 ids=[] mem=live\n" {
			t.Fatalf("copy in branch %s: its fork call printed %q; want rc=0 ids=[] mem=live", k, got)
		}
		// Its socket is its own branch's.
		if got := replIn(t, ctx, env, sc, k, 3, `branchctl self tree --json | tr -d ' \n' | grep -o '"self":"[0-9]*"'`); got != fmt.Sprintf("\"self\":%q\n", k) {
			t.Fatalf("copy in branch %s: self tree says %q", k, got)
		}
	}
	// A descendant's processes, which the caller is not among, are forked
	// from inside as from outside.
	if got := replVia(t, root, 3, fmt.Sprintf(`kid=$(branchctl self fork --parent %s --memory 2>&1); echo "rc=$? kid=[$kid]"`, b)); !strings.HasPrefix(got, "rc=0 kid=[") || got == "rc=0 kid=[]\n" {
		t.Fatalf("self fork --parent %s --memory printed %q; want rc=0 and a branch id", b, got)
	}
	if _, err := sc.Commit(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 4, `echo "mem=$mem"`); got != "mem=live\n" {
		t.Fatalf("sandbox after the commit: %q", got)
	}
	assertNoMemoryImages(t, env)
}

// TestMemorySelfCheckpoint: a process of the sandbox's tree checkpoints
// its own sandbox with memory through the branch socket (branchctl self
// checkpoint --memory, run by the REPL): the call returns in the sandbox
// with the checkpoint, and returns again, printing nothing, in a copy
// restored from it later by a fork --from it, which continues from the
// checkpoint's state, not the sandbox's present, and in the sandbox itself
// rolled back to it.
func TestMemorySelfCheckpoint(t *testing.T) {
	ctx, env, sc := insockReplSandbox(t)
	replIn(t, ctx, env, sc, branch.RootID, 0, `mem=then`)
	out := replVia(t, branchInitPid(t, ctx, sc, branch.RootID), 1, `ck=$(branchctl self checkpoint warm --memory 2>&1); echo "rc=$? ck=[$ck] mem=$mem"`)
	if !strings.HasPrefix(out, "rc=0 ck=[checkpoint warm of ") || !strings.HasSuffix(out, "] mem=then\n") {
		t.Fatalf("self checkpoint --memory in the sandbox printed %q; want rc=0, the checkpoint, mem=then", out)
	}
	replIn(t, ctx, env, sc, branch.RootID, 2, `mem=now`)
	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, From: "warm", WithMemory: true})
	if err != nil {
		t.Fatalf("fork --from warm --memory: %v", err)
	}
	k := res.Branches[0].ID
	if got := copyOutput(t, ctx, sc, k, 1, "checkpoint"); got != "rc=0 ck=[] mem=then\n" {
		t.Fatalf("copy in branch %s: its checkpoint call printed %q; want rc=0 ck=[] mem=then", k, got)
	}
	if got := replIn(t, ctx, env, sc, k, 2, `echo "mem=$mem"`); got != "mem=then\n" {
		t.Fatalf("copy in branch %s continues with %q, want the checkpoint's mem=then", k, got)
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 3, `echo "mem=$mem"`); got != "mem=now\n" {
		t.Fatalf("sandbox: %q, want its own mem=now", got)
	}
	// The copy checkpoints itself the same way; a rollback of its branch
	// to that checkpoint restores it, and its call returns again there.
	if got := replVia(t, branchInitPid(t, ctx, sc, k), 3, `ck=$(branchctl self checkpoint step --memory 2>&1); echo "rc=$? ck=[$ck]"`); !strings.HasPrefix(got, "rc=0 ck=[checkpoint step of ") {
		t.Fatalf("self checkpoint --memory in branch %s printed %q", k, got)
	}
	replIn(t, ctx, env, sc, k, 4, `mem=changed`)
	if err := sc.Rollback(ctx, k, "step"); err != nil {
		t.Fatalf("rollback of branch %s to step: %v", k, err)
	}
	// Not copyOutput: this waits for the restored copy's own answer,
	// rc=0 ck=[], not for any output.
	var got string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		o, _ := run(t, ctx, sc, k, "cat", "/dev/shm/out.3")
		if got = o; got == "rc=0 ck=[]\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("branch %s after its rollback: its checkpoint call printed %q, want rc=0 ck=[]", k, got)
		}
	}
	if got := replIn(t, ctx, env, sc, k, 4, `echo "mem=$mem"`); got != "mem=then\n" {
		t.Fatalf("branch %s after its rollback: %q, want mem=then", k, got)
	}
	// The sandbox itself rolled back to its own checkpoint: its call
	// returns again there too.
	if _, err := sc.Abort(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := sc.Rollback(ctx, "", "warm"); err != nil {
		t.Fatalf("rollback of the sandbox to warm: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		o, _ := execIn(ctx, env, "sb", "cat", "/dev/shm/out.1")
		if got = o; got == "rc=0 ck=[] mem=then\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox after its rollback: its checkpoint call printed %q, want rc=0 ck=[] mem=then", got)
		}
	}
	if got := replIn(t, ctx, env, sc, branch.RootID, 2, `echo "mem=$mem"`); got != "mem=then\n" {
		t.Fatalf("sandbox after its rollback: %q, want mem=then", got)
	}
}

// copyOutput waits for the REPL's output of command k in branch b: the
// output of a self call that returned again in a restored copy.
func copyOutput(t *testing.T, ctx context.Context, sc *client.SandboxClient, b string, k int, call string) string {
	t.Helper()
	var got string
	waitUntil(t, fmt.Sprintf("the copy's output of its %s call in branch %s", call, b), 10*time.Second, func() bool {
		o, code := run(t, ctx, sc, b, "cat", fmt.Sprintf("/dev/shm/out.%d", k))
		got = o
		return code == 0
	})
	return got
}

// replVia runs REPL command k through the /dev/shm of the process pid (a
// branch's init, as the host sees it): for commands that dump their own
// branch, which a process exec'd into it to write or read the files
// (replIn's way) would be refused in.
func replVia(t *testing.T, pid, k int, line string) string {
	t.Helper()
	shm := fmt.Sprintf("/proc/%d/root/dev/shm", pid)
	if err := os.WriteFile(shm+"/.cmd", []byte(line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(shm+"/.cmd", fmt.Sprintf("%s/cmd.%d", shm, k)); err != nil {
		t.Fatal(err)
	}
	var out string
	waitUntil(t, fmt.Sprintf("output of command %d", k), 30*time.Second, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("%s/out.%d", shm, k))
		out = string(b)
		return err == nil
	})
	return out
}

// branchInitPid is the host pid of branch id's init.
func branchInitPid(t *testing.T, ctx context.Context, sc *client.SandboxClient, id string) int {
	t.Helper()
	tree, err := sc.Tree(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range tree {
		if n.ID == id && n.InitPid > 0 {
			return n.InitPid
		}
	}
	t.Fatalf("no init of %s in %+v", id, tree)
	return 0
}

// insockReplSandbox runs replScript as the sandbox "sb" with its branch
// socket and branchctl in the image, without the file the REPL holds open
// for append: a fork from inside seals its parent, which a writer would
// make a freeze of the caller too.
func insockReplSandbox(t *testing.T) (context.Context, *daemons.Env, *client.SandboxClient) {
	t.Helper()
	ctx, env, _ := shimEnv(t)
	importInsockImage(t, ctx, env)
	runInsockSandbox(t, ctx, env, "sb", true, "echo x > /state; "+strings.Replace(replScript, "exec 3>>/data.log; ", "", 1))
	sc, err := client.NewSandboxClient(ctx, env.Address, env.Namespace, "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return ctx, env, sc
}

// tmpfsMounts is the whole tmpfs mounts of a mountinfo: mount point ->
// mount options and superblock options. (A masked file is a bind of
// /dev/null, the container's in the sandbox, the host's in a restored
// branch, as runc's restore maps it.)
func tmpfsMounts(t *testing.T, mountinfo string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 6 && len(g) >= 3 && g[0] == "tmpfs" && f[3] == "/" {
			out[f[4]] = f[5] + " " + g[2]
		}
	}
	if len(out) == 0 {
		t.Fatalf("no tmpfs mount in %s", mountinfo)
	}
	return out
}
