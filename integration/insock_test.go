//go:build linux

package integration

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

const insockImage = "docker.io/branchbox/insock:test"

// importInsockImage imports the busybox image with branchctl (static) at
// /bin/branchctl, unpacked into the branch snapshotter.
func importInsockImage(t *testing.T, ctx context.Context, env *daemons.Env) {
	t.Helper()
	bin := filepath.Join(env.BinDir, "branchctl")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("branchctl not built (make binaries): %v", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked; build it with CGO_ENABLED=0 (make binaries does)", bin)
		}
	}
	f.Close()
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	importToolImage(t, ctx, env, insockImage, "bin/branchctl", data)
}

// importToolImage imports image ref, busybox with the executable data at
// path, unpacked into the branch snapshotter.
func importToolImage(t *testing.T, ctx context.Context, env *daemons.Env, ref, path string, data []byte) {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "image.tar")
	writeToolImage(t, archive, ref, path, data)
	if _, err := env.Ctr(ctx, "images", "import", "--snapshotter", "branch", archive); err != nil {
		t.Fatal(err)
	}
}

// writeToolImage writes image ref, busybox with the executable data at
// path, as an archive.
func writeToolImage(t *testing.T, archive, ref, path string, data []byte) {
	t.Helper()
	tool, err := ociimage.FileLayer(path, 0o755, data)
	if err != nil {
		t.Fatal(err)
	}
	base, err := ociimage.BusyboxLayer()
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	err = ociimage.WriteImage(out, ref, ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/"}, base, tool)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// runInsockSandbox runs a sandbox of the insock image, with the branch
// socket when socket is set, and waits until its script wrote /state.
func runInsockSandbox(t *testing.T, ctx context.Context, env *daemons.Env, id string, socket bool, script string) {
	t.Helper()
	args := []string{"run", "-d", "--runtime", branchRuntime, "--snapshotter", "branch"}
	if socket {
		args = append(args, "--annotation", "io.branchbox.socket=true")
	}
	args = append(args, insockImage, id, "sh", "-c", script)
	if _, err := env.Ctr(ctx, args...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeContainer(t, env, id) })
	waitFor(t, func() bool { _, err := execIn(ctx, env, id, "test", "-e", "/state"); return err == nil })
}

// selfTree is `branchctl self tree --json`; Contexts is its branches
// under their old key (docs/design.md#names), which must stay the same.
type selfTree struct {
	Self     string              `json:"self"`
	Branches []client.BranchInfo `json:"branches"`
	Contexts []client.BranchInfo `json:"contexts"`
}

func parseSelfTree(t *testing.T, out string) selfTree {
	t.Helper()
	var st selfTree
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("tree output %q: %v", out, err)
	}
	if !reflect.DeepEqual(st.Branches, st.Contexts) || st.Branches == nil {
		t.Fatalf("tree output %q: branches and contexts differ, or are missing", out)
	}
	return st
}

func (st selfTree) ids() []string {
	var ids []string
	for _, c := range st.Branches {
		ids = append(ids, c.ID)
	}
	return ids
}

func (st selfTree) state(id string) client.BranchInfo {
	for _, c := range st.Branches {
		if c.ID == id {
			return c
		}
	}
	return client.BranchInfo{}
}

// shimOf is the pid of the shim serving container id.
func shimOf(t *testing.T, env *daemons.Env, id string) int {
	t.Helper()
	for _, pid := range env.ShimPids() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(b), "\x00-id\x00"+id+"\x00") {
			return pid
		}
	}
	t.Fatalf("no shim for %s", id)
	return 0
}

// selfListeners counts the branch sockets a shim listens on: its socket
// descriptors that are listening unix sockets named .../branch.sock.
func selfListeners(t *testing.T, pid int) int {
	t.Helper()
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fl := strings.Fields(sc.Text())
		if len(fl) == 8 && fl[3] == "00010000" && inodes[fl[6]] && strings.HasSuffix(fl[7], "/branch.sock") {
			n++
		}
	}
	return n
}

// socketDirs lists the branch socket directories left in a sandbox's bundle.
func socketDirs(env *daemons.Env, id string) []string {
	bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, id)
	a, _ := filepath.Glob(filepath.Join(bundle, "selfsock"))
	b, _ := filepath.Glob(filepath.Join(bundle, "branches", "*", "selfsock"))
	return append(a, b...)
}

// TestInsock drives branching from inside sandboxes through their branch
// sockets: without the annotation there is none; with it, the sandbox's
// process forks, runs in its branches, nests, and a branch commits
// itself (the sandbox's running init sees the change); a branch reaches
// only itself and its descendants, a sandbox never another's, a process
// outside the branch is refused; and every socket, listener and
// directory goes with its branch (commit, abort, self-abort, delete).
func TestInsock(t *testing.T) {
	ctx, env, _ := shimEnv(t)
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
	// selfIn runs `branchctl self ARGS` in a branch of sb, from sb itself.
	selfIn := func(b string, args ...string) (string, error) {
		return in("sb", append([]string{"branchctl", "self", "exec", b, "--", "branchctl", "self"}, args...)...)
	}

	// Without the annotation: nothing mounted, nothing listening.
	runInsockSandbox(t, ctx, env, "plain", false, "echo x > /state; exec sleep 100000")
	if out, err := in("plain", "branchctl", "self", "tree"); err == nil || !strings.Contains(out+err.Error(), "no branch socket at /run/branchbox/branch.sock") {
		t.Fatalf("branchctl self tree without the annotation: %q %v", out, err)
	}
	if _, err := in("plain", "test", "-e", "/run/branchbox"); err == nil {
		t.Fatal("/run/branchbox exists in a sandbox without the annotation")
	}
	if n := selfListeners(t, shimOf(t, env, "plain")); n != 0 || len(socketDirs(env, "plain")) != 0 {
		t.Fatalf("sandbox without the annotation: %d listeners, socket dirs %v", n, socketDirs(env, "plain"))
	}

	// sb's init waits for a branch's commit and copies what it sees.
	runInsockSandbox(t, ctx, env, "sb", true,
		"echo before > /state; until [ -e /only-a ] && cp /only-a /seen 2>/dev/null; do sleep 0.05; done; exec sleep 100000")
	runInsockSandbox(t, ctx, env, "sb2", true, "echo other > /state; exec sleep 100000")
	shim := shimOf(t, env, "sb")
	if st := parseSelfTree(t, must("sb", "branchctl", "self", "tree", "--json")); st.Self != "0" || len(st.Branches) != 1 {
		t.Fatalf("the sandbox's own tree: %+v", st)
	}
	// The socket's directory is read-only: it cannot be replaced.
	if out := must("sb", "ls", "/run/branchbox"); out != "branch.sock\n" {
		t.Fatalf("/run/branchbox holds %q", out)
	}
	for _, c := range []string{"touch /run/branchbox/x", "rm /run/branchbox/branch.sock"} {
		if _, err := in("sb", "sh", "-c", c); err == nil {
			t.Fatalf("%s succeeded inside the sandbox", c)
		}
	}

	// Fork from inside; each branch has its own socket, leading to itself.
	var kids []client.BranchInfo
	if err := json.Unmarshal([]byte(must("sb", "branchctl", "self", "fork", "-n", "2", "--json")), &kids); err != nil || len(kids) != 2 {
		t.Fatalf("fork from inside: %v %+v", err, kids)
	}
	a, b := kids[0].ID, kids[1].ID
	if kids[0].InitPid != 0 || kids[0].Cgroup != "" {
		t.Fatalf("host pids or cgroups shown inside: %+v", kids[0])
	}
	if n := selfListeners(t, shim); n != 3 {
		t.Fatalf("%d branch sockets listening after a fork of 2, want 3", n)
	}
	must("sb", "branchctl", "self", "exec", a, "--", "sh", "-c", "echo from-a > /state; echo a > /only-a")
	must("sb", "branchctl", "self", "exec", b, "--", "sh", "-c", "echo from-b > /state")
	if out := must("sb", "branchctl", "self", "exec", b, "--", "cat", "/state"); out != "from-b\n" {
		t.Fatalf("exec output from b: %q", out)
	}
	if out, err := in("sb", "branchctl", "self", "exec", b, "--", "sh", "-c", "echo oops >&2; exit 3"); err == nil || !strings.Contains(err.Error(), "oops") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("failing exec in b: %q %v", out, err)
	}
	// A supervisor's SIGTERM to self exec (busybox timeout here) goes to
	// the command and what it started; a background process holding the
	// output does not keep self exec waiting past it.
	for _, c := range []struct{ script, want string }{
		{"sleep 3201 & sleep 3202", "rc=143"},
		{"sleep 3203 & echo bg", "bg\nrc=0"},
	} {
		out := must("sb", "sh", "-c", "timeout -s TERM 1 branchctl self exec "+b+" -- sh -c '"+c.script+"' 2>/dev/null; echo rc=$?")
		if strings.TrimSpace(out) != c.want {
			t.Fatalf("self exec of %q under a timeout's SIGTERM: %q, want %q", c.script, out, c.want)
		}
	}
	waitFor(t, func() bool {
		return !strings.Contains(must("sb", "branchctl", "self", "exec", b, "--", "ps", "-o", "args"), "sleep 320")
	})
	if st := parseSelfTree(t, must("sb", "branchctl", "self", "exec", a, "--", "branchctl", "self", "tree", "--json")); st.Self != a || strings.Join(st.ids(), ",") != a {
		t.Fatalf("a's tree through its own socket: self %s, branches %v; want only %s", st.Self, st.ids(), a)
	}

	// A branch names neither its parent nor its sibling nor anything
	// else; an id that does not exist gets the same answer.
	for _, args := range [][]string{
		{"exec", b, "--", "true"}, {"abort", b}, {"commit", b}, {"commit", "0"}, {"abort", "0"},
		{"fork", "--parent", "0"}, {"fork", "--parent", b}, {"checkpoint", "--branch", b, "x"},
		{"rollback", "--branch", "0", "x"}, {"abort", "999"},
	} {
		if out, err := selfIn(a, args...); err == nil || !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), "not this branch") {
			t.Fatalf("branchctl self %v in branch %s: %q %v; want permission denied", args, a, out, err)
		}
	}
	// Another sandbox reaches nothing of sb.
	if out, err := in("sb2", "branchctl", "self", "exec", a, "--", "true"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("sb2 runs in sb's branch %s: %q %v", a, out, err)
	}
	if st := parseSelfTree(t, must("sb2", "branchctl", "self", "tree", "--json")); strings.Join(st.ids(), ",") != "0" {
		t.Fatalf("sb2's tree: %v", st.ids())
	}
	// A process outside the branch (this test, on the host) is refused at
	// connect, even with the socket's path.
	bundle := filepath.Join(env.ContainerdState, "io.containerd.runtime.v2.task", env.Namespace, "sb")
	dir, err := os.Open(filepath.Join(bundle, "selfsock"))
	if err != nil {
		t.Fatal(err)
	}
	hc, err := client.DialSelf(ctx, fmt.Sprintf("/proc/self/fd/%d/branch.sock", dir.Fd()))
	dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err = hc.Tree(ctx); err == nil {
		t.Fatal("a host process got sb's tree through its socket")
	}
	t.Logf("host process on sb's socket: %v", err)
	hc.Close()

	// Nesting: b forks c, runs in it and commits it into itself.
	var sub []client.BranchInfo
	if out, err := selfIn(b, "fork", "-n", "1", "--json"); err != nil || json.Unmarshal([]byte(out), &sub) != nil || len(sub) != 1 {
		t.Fatalf("fork in b: %q %v", out, err)
	}
	c := sub[0].ID
	if _, err := selfIn(b, "exec", c, "--", "sh", "-c", "echo c > /only-c"); err != nil {
		t.Fatal(err)
	}
	if st := parseSelfTree(t, must("sb", "branchctl", "self", "tree", "--json")); st.state(c).Parent != b {
		t.Fatalf("nested branch %s: %+v", c, st.state(c))
	}
	if _, err := selfIn(b, "commit", c); err != nil {
		t.Fatal(err)
	}
	if out := must("sb", "branchctl", "self", "exec", b, "--", "cat", "/only-c"); out != "c\n" {
		t.Fatalf("b after committing %s: %q", c, out)
	}
	if n := selfListeners(t, shim); n != 3 {
		t.Fatalf("%d branch sockets after %s's commit, want 3", n, c)
	}

	// a commits itself: its processes (the caller too) are killed, so the
	// call does not return; sb's running init sees the change, b is stale.
	if out, err := selfIn(a, "commit"); strings.Contains(out, "committed") {
		t.Fatalf("self-commit returned: %q %v", out, err)
	}
	waitFor(t, func() bool { out, _ := in("sb", "cat", "/seen"); return out == "a\n" })
	if out := must("sb", "cat", "/state"); out != "from-a\n" {
		t.Fatalf("sb after a's commit: /state %q", out)
	}
	st := parseSelfTree(t, must("sb", "branchctl", "self", "tree", "--json"))
	if st.state(a).State != branch.Committed || st.state(b).State != branch.Stale || st.state(b).Winner != a {
		t.Fatalf("after a's self-commit: a %+v, b %+v", st.state(a), st.state(b))
	}
	if n := selfListeners(t, shim); n != 1 || len(socketDirs(env, "sb")) != 1 {
		t.Fatalf("after the commit: %d listeners, socket dirs %v; want only sb's", n, socketDirs(env, "sb"))
	}

	// A command's output, read from the parent (self logs).
	if err := json.Unmarshal([]byte(must("sb", "branchctl", "self", "fork", "-n", "1", "--json", "--", "sh", "-c", "echo from the command; exec sleep 100000")), &kids); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		out, _ := in("sb", "branchctl", "self", "logs", kids[0].ID)
		return out == "from the command\n"
	})
	must("sb", "branchctl", "self", "abort", kids[0].ID)

	// Abort from the parent, and a branch whose init aborts itself.
	if err := json.Unmarshal([]byte(must("sb", "branchctl", "self", "fork", "-n", "1", "--json")), &kids); err != nil {
		t.Fatal(err)
	}
	if _, err := in("sb", "branchctl", "self", "abort", kids[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(must("sb", "branchctl", "self", "fork", "-n", "1", "--json", "--", "branchctl", "self", "abort")), &kids); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		out, _ := in("sb", "branchctl", "self", "tree", "--json")
		return parseSelfTree(t, out).state(kids[0].ID).State == branch.Aborted
	})
	if n := selfListeners(t, shim); n != 1 || len(socketDirs(env, "sb")) != 1 {
		t.Fatalf("after the aborts: %d listeners, socket dirs %v; want only sb's", n, socketDirs(env, "sb"))
	}

	// Only the sandbox's own user may use its socket: another user in the
	// sandbox would otherwise run commands as that one in its branches.
	if out, err := in("sb2", "su", "-s", "/bin/sh", "-c", "branchctl self tree", "nobody"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("user nobody on sb2's socket: %q %v", out, err)
	}

	// Checkpoint and rollback of its own branch, from inside.
	must("sb2", "sh", "-c", "echo one > /v && branchctl self checkpoint c1 && echo two > /v && branchctl self rollback c1")
	if out := must("sb2", "cat", "/v"); out != "one\n" {
		t.Fatalf("sb2 after rolling back from inside: %q", out)
	}

	// Deleting a sandbox with a live branch leaves no socket behind.
	must("sb", "branchctl", "self", "fork", "-n", "1")
	if n := selfListeners(t, shim); n != 2 {
		t.Fatalf("%d listeners before the delete, want 2", n)
	}
	removeContainer(t, env, "sb")
	if d := socketDirs(env, "sb"); len(d) != 0 {
		t.Fatalf("socket dirs left after the sandbox's delete: %v", d)
	}
}

// TestCRIInsockAnnotation checks what the CRI passes through (the runtime
// handler's pod_annotations and container_annotations, as the documented
// configuration sets them): io.branchbox.socket on a pod gives its
// containers the socket, on a container gives that container the socket;
// a pod's pause container and a container without it get none. The
// bounds' annotations reach the shim the same ways (max-branches and
// max-checkpoints on a pod, max-checkpoint-bytes on a container).
func TestCRIInsockAnnotation(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsNode, pid: nsContainer, ipc: nsPod}
	runPod := func(name string, annotations map[string]string) (string, string) {
		cfg := c.writeJSON(name+"-pod.json", map[string]any{
			"metadata":      map[string]any{"name": name, "namespace": "default", "uid": name + "-uid", "attempt": 0},
			"annotations":   annotations,
			"log_directory": filepath.Join(c.dir, "logs", name),
			"linux": map[string]any{
				"cgroup_parent":    "/" + c.env.Namespace,
				"security_context": map[string]any{"namespace_options": ns.options()},
			},
		})
		out, err := c.env.Crictl(c.ctx, "runp", "--runtime", "branch", cfg)
		if err != nil {
			t.Fatal(err)
		}
		id := lastLine(out)
		c.ids = append(c.ids, id)
		return id, cfg
	}
	start := func(pod, podCfg, name string, annotations map[string]string) string {
		cfg := c.writeJSON(name+"-container.json", map[string]any{
			"metadata":    map[string]any{"name": name, "attempt": 0},
			"image":       map[string]any{"image": criAppImage},
			"command":     []string{"sleep", "1000"},
			"annotations": annotations,
			"log_path":    name + ".log",
			"linux":       map[string]any{"security_context": map[string]any{"namespace_options": ns.options()}},
		})
		out, err := c.env.Crictl(c.ctx, "create", pod, cfg, podCfg)
		if err != nil {
			t.Fatal(err)
		}
		id := lastLine(out)
		c.ids = append(c.ids, id)
		if _, err := c.env.Crictl(c.ctx, "start", id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// The bounds come the same way (the handler lists them): two on the
	// pod, one on a container.
	podOn, podOnCfg := runPod("sock-pod", map[string]string{"io.branchbox.socket": "true", "io.branchbox.max-branches": "2", "io.branchbox.max-checkpoints": "1"})
	podOff, podOffCfg := runPod("plain-pod", nil)
	viaPod := start(podOn, podOnCfg, "via-pod", nil)
	viaCtr := start(podOff, podOffCfg, "via-container", map[string]string{"io.branchbox.socket": "true", "io.branchbox.max-checkpoint-bytes": "1MiB"})
	none := start(podOff, podOffCfg, "none", nil)
	for id, want := range map[string]string{viaPod: "branch.sock", viaCtr: "branch.sock", none: ""} {
		out, _ := c.env.Crictl(c.ctx, "exec", "-s", id, "ls", "/run/branchbox")
		if strings.TrimSpace(out) != want {
			t.Errorf("container %s: /run/branchbox holds %q, want %q", id, out, want)
		}
	}
	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, viaPod)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.Fork(c.ctx, client.ForkOptions{Count: 3}); err == nil || !strings.Contains(err.Error(), "may have live, 2 (annotation io.branchbox.max-branches)") {
		t.Errorf("fork of 3 in a pod with max-branches 2: %v", err)
	}
	if _, err := sc.Checkpoint(c.ctx, "", "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Checkpoint(c.ctx, "", "second"); err == nil || !strings.Contains(err.Error(), "it has 1 checkpoint, its maximum (annotation io.branchbox.max-checkpoints)") {
		t.Errorf("second checkpoint in a pod with max-checkpoints 1: %v", err)
	}
	if _, err := c.env.Crictl(c.ctx, "exec", "-s", viaCtr, "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=2"); err != nil {
		t.Fatal(err)
	}
	ctrSC, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, viaCtr)
	if err != nil {
		t.Fatal(err)
	}
	defer ctrSC.Close()
	if _, err := ctrSC.Checkpoint(c.ctx, "", "big"); err == nil || !strings.Contains(err.Error(), "past their maximum of 1MiB (annotation io.branchbox.max-checkpoint-bytes)") {
		t.Errorf("checkpoint of 2 MB in a container with max-checkpoint-bytes 1MiB: %v", err)
	}
	for _, pod := range []string{podOn, podOff} {
		bundle := filepath.Join(c.env.ContainerdState, "io.containerd.runtime.v2.task", daemons.CRINamespace, pod)
		if _, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil {
			t.Fatalf("pause container's bundle: %v", err)
		}
		if _, err := os.Stat(filepath.Join(bundle, "selfsock")); err == nil {
			t.Errorf("pause container of pod %s has a branch socket", pod)
		}
	}
}
