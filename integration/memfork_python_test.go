//go:build linux

package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// importPythonImage imports busybox with Debian's python3 over it.
func importPythonImage(t *testing.T, ctx context.Context, env *daemons.Env) {
	t.Helper()
	base, err := ociimage.BusyboxLayer()
	if err != nil {
		t.Fatal(err)
	}
	py, err := ociimage.PythonLayer()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "python.tar")
	out, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	err = ociimage.WriteImage(out, ociimage.PythonImageRef, ocispec.ImageConfig{Env: []string{"PATH=/usr/bin:/bin"}, Cmd: []string{"/usr/bin/python3"}, WorkingDir: "/"}, base, py)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Ctr(ctx, "images", "import", "--snapshotter", "branch", archive); err != nil {
		t.Fatal(err)
	}
}

// pyREPL is Python's own interactive interpreter (python3 -i) as the
// sandbox's init, reading its input from a FIFO in the container's /dev/shm
// (held open for reading and writing, so that it never sees an end) and
// writing its prompts and output to /dev/shm/out.
const pyREPL = `mkfifo /dev/shm/in && exec python3 -q -u -i 0<>/dev/shm/in >/dev/shm/out 2>&1`

// pySandbox runs pyREPL as the sandbox "sb" of the Python image and
// returns a client once the REPL reads its FIFO.
func pySandbox(t *testing.T) (context.Context, *daemons.Env, *client.SandboxClient) {
	t.Helper()
	ctx, env, _ := shimEnv(t)
	importPythonImage(t, ctx, env)
	sc := runSandbox(t, ctx, env, ociimage.PythonImageRef, "sh", "-c", pyREPL)
	waitFor(t, func() bool { _, err := execIn(ctx, env, "sb", "test", "-p", "/dev/shm/in"); return err == nil })
	return ctx, env, sc
}

// pyIn types a line into the REPL of a branch (the sandbox, "0", or a
// branch) and waits until its output holds want.
func pyIn(t *testing.T, ctx context.Context, env *daemons.Env, sc *client.SandboxClient, b, line, want string) {
	t.Helper()
	typeIt := []string{"sh", "-c", `printf '%s\n' "$1" > /dev/shm/in`, "_", line}
	read := []string{"cat", "/dev/shm/out"}
	var out string
	if b == branch.RootID {
		if o, err := execIn(ctx, env, "sb", typeIt...); err != nil {
			t.Fatalf("sandbox: type %q: %v %s", line, err, o)
		}
	} else {
		mustRun(t, ctx, sc, b, typeIt...)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b == branch.RootID {
			out, _ = execIn(ctx, env, "sb", read...)
		} else {
			out, _ = run(t, ctx, sc, b, read...)
		}
		if strings.Contains(out, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("branch %s: after %q the REPL's output has no %q:\n%s", b, line, want, out)
}

// TestMemoryForkPythonREPL forks a Python REPL four ways with its memory:
// a variable, a file it holds open for append and a unix socket pair with
// a message queued carry over, each branch continues and diverges, the
// first branch whose "test" passes is committed, the others are invalidated and killed, and the sandbox has
// the winner's file and its own interpreter's state (docs/memory-fork.md:
// a commit brings the winner's files, not its processes).
func TestMemoryForkPythonREPL(t *testing.T) {
	ctx, env, sc := pySandbox(t)
	pyIn(t, ctx, env, sc, branch.RootID, `x = 41; tries = []; log = open('/data.log', 'a'); log.write('before\n'); log.flush(); print('ready', x)`, "ready 41")
	// A unix socket pair with a message queued in it: each copy has its
	// own pair, the message in it.
	pyIn(t, ctx, env, sc, branch.RootID, `import socket; sa, sb = socket.socketpair(); sa.send(b'queued'); print('paired')`, "paired")

	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 4, WithMemory: true})
	if err != nil {
		t.Fatalf("memory fork of the REPL: %v", err)
	}
	t.Logf("memory fork of 4 Python REPLs: parent stopped %s, dump %s, restore %s, image %d bytes", res.Memory.Pause, res.Memory.Dump, res.Memory.Restore, res.Memory.ImageBytes)
	kids := res.Branches
	for _, k := range kids {
		pyIn(t, ctx, env, sc, k.ID, fmt.Sprintf(`print('branch %s sees', x, len(tries), sb.recv(16))`, k.ID), fmt.Sprintf("branch %s sees 41 0 b'queued'", k.ID))
	}
	// Each tries its own value; the "test" passes for an even one.
	for i, k := range kids {
		pyIn(t, ctx, env, sc, k.ID, fmt.Sprintf(`x = %d; tries.append(x); log.write('tried %d\n'); log.flush(); print('passes' if x %% 2 == 0 else 'fails', x)`, 100+i, 100+i), fmt.Sprint(100+i))
	}
	for i, k := range kids {
		if got := mustRun(t, ctx, sc, k.ID, "cat", "/data.log"); got != fmt.Sprintf("before\ntried %d\n", 100+i) {
			t.Fatalf("branch %s: /data.log %q", k.ID, got)
		}
	}
	var winner client.BranchInfo
	for i, k := range kids {
		out := mustRun(t, ctx, sc, k.ID, "cat", "/dev/shm/out")
		if strings.Contains(out, fmt.Sprintf("passes %d", 100+i)) {
			winner = k
			break
		}
	}
	if winner.ID == "" {
		t.Fatal("no branch passed")
	}
	cr, err := sc.Commit(ctx, winner.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(cr.Invalidated) != len(kids)-1 {
		t.Fatalf("commit invalidated %v, want the %d others", cr.Invalidated, len(kids)-1)
	}
	for _, k := range kids {
		assertBranchGone(t, env, k, nil)
	}
	if out, err := execIn(ctx, env, "sb", "cat", "/data.log"); err != nil || out != "before\ntried 100\n" {
		t.Fatalf("sandbox's /data.log after the commit: %q %v", out, err)
	}
	pyIn(t, ctx, env, sc, branch.RootID, `print('parent has', x, tries, sb.recv(16))`, "parent has 41 [] b'queued'")
	// An io_uring instance (io_uring_setup, 425 on every architecture),
	// whose descriptor CRIU cannot dump: refused before the dump, naming
	// it (before, CRIU stopped the REPL and failed with "Can't retrieve
	// FDs from socket"); once closed, the REPL forks again.
	pyIn(t, ctx, env, sc, branch.RootID, `import ctypes; ring = ctypes.CDLL(None, use_errno=True).syscall(425, 8, ctypes.create_string_buffer(120)); print('ring', ring > 0)`, "ring True")
	_, err = sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "(python3) holds an io_uring instance") {
		t.Fatalf("memory fork of a REPL holding an io_uring instance: %v; want failed precondition naming it", err)
	}
	pyIn(t, ctx, env, sc, branch.RootID, `import os; os.close(ring); print('closed')`, "closed")
	// File locks, as SQLite and lock files hold them (flock and fcntl):
	// a dump failed on them ("Some file locks are hold by dumping
	// tasks"). Each copy holds them again, on its own copy of the files:
	// another process of the branch cannot take them.
	pyIn(t, ctx, env, sc, branch.RootID, `import fcntl; lk1 = open('/lock1', 'w'); fcntl.flock(lk1, fcntl.LOCK_EX); lk2 = open('/lock2', 'w'); fcntl.lockf(lk2, fcntl.LOCK_EX); print('locked')`, "locked")
	kid := fork(t, ctx, sc, client.ForkOptions{Count: 1, WithMemory: true})[0]
	pyIn(t, ctx, env, sc, kid.ID, `print('copy has', x)`, "copy has 41")
	const tryLocks = `import fcntl, sys
for name, lock in (('/lock1', fcntl.flock), ('/lock2', fcntl.lockf)):
    try:
        lock(open(name, 'r+'), fcntl.LOCK_EX | fcntl.LOCK_NB); print(name, 'free')
    except OSError: print(name, 'held')`
	if out := mustRun(t, ctx, sc, kid.ID, "python3", "-c", tryLocks); out != "/lock1 held\n/lock2 held\n" {
		t.Errorf("the memory branch's locks, tried by another process of it: %q; want both held by its copy of the REPL", out)
	}
	if _, err := sc.Abort(ctx, kid.ID); err != nil {
		t.Fatal(err)
	}
	assertNoMemoryImages(t, env)
}

// TestMemoryForkDirty100MB forks a process holding 100 MB of dirty memory,
// then forks the memory branch again (a nested memory fork): each copy
// has the whole of it, and the nested one commits into its parent.
func TestMemoryForkDirty100MB(t *testing.T) {
	ctx, env, sc := pySandbox(t)
	// Every page written with its own number (mod 251), so that a page
	// copied from the wrong place or left zero shows in the sum.
	pyIn(t, ctx, env, sc, branch.RootID, `b = bytearray(100 << 20); exec("for i in range(0, len(b), 4096): b[i] = (i >> 12) % 251"); print('dirty', sum(b))`, "dirty ")
	want := 0
	for i := 0; i < 100<<20; i += 4096 {
		want += (i >> 12) % 251
	}
	res, err := sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Memory.ImageBytes < 100<<20 {
		t.Fatalf("memory image of %d bytes for 100 MB of dirty memory", res.Memory.ImageBytes)
	}
	t.Logf("memory fork of 100 MB dirty: parent stopped %s, dump %s, restore %s, image %d bytes", res.Memory.Pause, res.Memory.Dump, res.Memory.Restore, res.Memory.ImageBytes)
	b1 := res.Branches[0]
	pyIn(t, ctx, env, sc, b1.ID, `print('copy has', sum(b), len(b))`, fmt.Sprintf("copy has %d %d", want, 100<<20))
	pyIn(t, ctx, env, sc, b1.ID, `b[0] = 7; open('/nested', 'w').write('from b1'); print('b1 changed')`, "b1 changed")
	// A memory fork of the memory branch.
	nested, err := sc.ForkResult(ctx, client.ForkOptions{Parent: b1.ID, Count: 1, WithMemory: true})
	if err != nil {
		t.Fatalf("nested memory fork: %v", err)
	}
	b2 := nested.Branches[0]
	if b2.Parent != b1.ID || !b2.MemoryFork {
		t.Fatalf("nested branch %+v", b2)
	}
	pyIn(t, ctx, env, sc, b2.ID, `print('nested has', b[0], sum(b) - b[0])`, fmt.Sprintf("nested has 7 %d", want))
	mustRun(t, ctx, sc, b2.ID, "sh", "-c", "echo from-b2 > /nested")
	if _, err := sc.Commit(ctx, b2.ID); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, ctx, sc, b1.ID, "cat", "/nested"); got != "from-b2\n" {
		t.Fatalf("b1 after the nested commit: /nested %q", got)
	}
	pyIn(t, ctx, env, sc, b1.ID, `print('b1 still has', b[0])`, "b1 still has 7")
	assertNoMemoryImages(t, env)
}

// TestMemoryForkOnVolume: what a memory fork's copies would share with
// the sandbox through a bind mount (a volume): a lock on one of its files,
// which no copy could take again while the sandbox holds it (CRIU's
// restore waited on it until the restore's 20 s bound, then failed as a
// damaged image), and unix sockets connected to the host's through it, a
// stream and a datagram one (CRIU failed the dump after stopping the
// processes: "External socket is used", "Unix socket ... without peer").
// Refused before the dump, naming the processes, the file, the mount and
// the peers.
func TestMemoryForkOnVolume(t *testing.T) {
	ctx, env, _ := shimEnv(t)
	importPythonImage(t, ctx, env)
	vol := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(vol, "host.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	dgram, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(vol, "host.dgram"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer dgram.Close()
	sc := runSandboxWith(t, ctx, env, []string{"--mount", "type=bind,src=" + vol + ",dst=/vol,options=rbind:rw"}, ociimage.PythonImageRef,
		"python3", "-c", "import fcntl, socket, time; s = socket.socket(socket.AF_UNIX); s.connect('/vol/host.sock'); d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); d.connect('/vol/host.dgram'); f = open('/vol/lk', 'w'); fcntl.flock(f, fcntl.LOCK_EX); open('/dev/shm/ready', 'w'); time.sleep(100000)")
	waitUntil(t, "the lock", 20*time.Second, func() bool { _, err := execIn(ctx, env, "sb", "test", "-e", "/dev/shm/ready"); return err == nil })
	start := time.Now()
	_, err = sc.ForkResult(ctx, client.ForkOptions{Count: 1, WithMemory: true})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "(python3) holds a lock on /vol/lk (descriptor 5), a file of the mount at /vol") ||
		!strings.Contains(err.Error(), fmt.Sprintf("(python3) has a unix socket connected to process %d (", os.Getpid())) ||
		!strings.Contains(err.Error(), "(python3) has a unix datagram socket (descriptor 4) connected to "+filepath.Join(vol, "host.dgram")) {
		t.Fatalf("memory fork holding a lock on a volume's file and sockets to the host: %v (after %v); want failed precondition naming all three", err, time.Since(start))
	}
	assertNoMemoryImages(t, env)
}
