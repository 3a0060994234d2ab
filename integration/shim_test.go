//go:build linux

package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestShimDropIn runs the same lifecycle as with runc-v2, through ctr and
// the Go client, on both snapshotters: stdio and exit codes, exec with and
// without a terminal, pids, pause and resume, stats, update, kill with a
// chosen signal, wait, delete, and the OCI spec fields ctr can set.
func TestShimDropIn(t *testing.T) {
	ctx, env, client := shimEnv(t)
	for _, sn := range []string{"branch", "overlayfs"} {
		t.Run("snapshotter="+sn, func(t *testing.T) {
			run := func(args ...string) (string, string, int) {
				return ctrExit(ctx, env, append([]string{"run", "--rm", "--runtime", branchRuntime, "--snapshotter", sn}, args...)...)
			}
			// stdio and exit code of a foreground container.
			out, errOut, code := run(ociimage.ImageRef, "fg-"+sn, "sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 7")
			if code != 7 || out != "to-stdout\n" || !strings.Contains(errOut, "to-stderr") {
				t.Fatalf("foreground run: code %d stdout %q stderr %q", code, out, errOut)
			}

			// OCI spec fields: env, cwd, user and groups, hostname, rlimits
			// via the image defaults, read-only rootfs, masked and
			// read-only paths, a bind mount, no-new-privileges, seccomp,
			// capabilities.
			host := t.TempDir()
			if err := os.WriteFile(filepath.Join(host, "f"), []byte("from-host"), 0o644); err != nil {
				t.Fatal(err)
			}
			script := strings.Join([]string{
				`echo env=$FOO`,
				`echo cwd=$(pwd)`,
				`echo id=$(id -u):$(id -g)`,
				`echo host=$(hostname)`,
				`echo mnt=$(cat /mnt/f)`,
				`touch /rootfs-write 2>/dev/null && echo rootfs=rw || echo rootfs=ro`,
				`echo keys=$(cat /proc/keys 2>&1 | wc -c)`,
				`echo 1 > /proc/sys/kernel/domainname 2>/dev/null && echo procsys=rw || echo procsys=ro`,
				`grep -E '^(NoNewPrivs|Seccomp|CapEff):' /proc/self/status | tr -d '\t ' `,
			}, "; ")
			out, errOut, code = run("--env", "FOO=bar", "--cwd", "/tmp", "--user", "1000:1000", "--hostname", "boxhost",
				"--read-only", "--seccomp", "--mount", "type=bind,src="+host+",dst=/mnt,options=rbind:ro",
				ociimage.ImageRef, "spec-"+sn, "sh", "-c", script)
			if code != 0 {
				t.Fatalf("spec run: code %d: %s %s", code, out, errOut)
			}
			for _, want := range []string{"env=bar", "cwd=/tmp", "id=1000:1000", "host=boxhost", "mnt=from-host",
				"rootfs=ro", "keys=0", "procsys=ro", "NoNewPrivs:1", "Seccomp:2", "CapEff:0000000000000000"} {
				if !strings.Contains(out, want+"\n") {
					t.Errorf("spec run: want %q in output:\n%s", want, out)
				}
			}
			out, _, code = run("--cap-drop", "CAP_CHOWN", ociimage.ImageRef, "caps-"+sn, "sh", "-c", "grep CapBnd /proc/self/status; chown 1 /tmp && echo chown-ok || echo chown-denied")
			if code != 0 || !strings.Contains(out, "chown-denied") {
				t.Errorf("dropped CAP_CHOWN still allowed chown: %s", out)
			}

			// rlimits and additional groups, which ctr cannot set.
			img, err := client.GetImage(ctx, ociimage.ImageRef)
			if err != nil {
				t.Fatal(err)
			}
			rl := "rl-" + sn
			rc, err := client.NewContainer(ctx, rl, containerd.WithSnapshotter(sn), containerd.WithNewSnapshot(rl, img),
				containerd.WithRuntime(branchRuntime, nil),
				containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sh", "-c", "ulimit -n; ulimit -Hn; id -G"),
					func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
						s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 321, Hard: 654}}
						s.Process.User = specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{2000, 3000}}
						return nil
					}))
			if err != nil {
				t.Fatal(err)
			}
			var rlOut syncBuffer
			rtask, err := rc.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &rlOut, &rlOut)))
			if err != nil {
				t.Fatal(err)
			}
			rch, err := rtask.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := rtask.Start(ctx); err != nil {
				t.Fatal(err)
			}
			<-rch
			rtask.IO().Wait()
			if got := rlOut.String(); got != "321\n654\n1000 2000 3000\n" {
				t.Errorf("rlimits and groups: got %q", got)
			}
			if _, err := rtask.Delete(ctx); err != nil {
				t.Fatal(err)
			}
			if err := rc.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
				t.Fatal(err)
			}

			// stdin reaches the container, and closing it (CloseIO, as ctr
			// does at the end of its input) gives the process EOF.
			in := "in-" + sn
			ic, err := client.NewContainer(ctx, in, containerd.WithSnapshotter(sn), containerd.WithNewSnapshot(in, img),
				containerd.WithRuntime(branchRuntime, nil),
				containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sh", "-c", "wc -l")))
			if err != nil {
				t.Fatal(err)
			}
			stdinR, stdinW := io.Pipe()
			var inOut syncBuffer
			// Set before any input is written, so before the reader's EOF.
			var itask containerd.Task
			itask, err = ic.NewTask(ctx, cio.NewCreator(cio.WithStreams(&eofReader{r: stdinR, eof: func() {
				_ = itask.CloseIO(ctx, containerd.WithStdinCloser)
			}}, &inOut, &inOut)))
			if err != nil {
				t.Fatal(err)
			}
			ich, err := itask.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := itask.Start(ctx); err != nil {
				t.Fatal(err)
			}
			_, _ = io.WriteString(stdinW, "line1\nline2\nline3\n")
			stdinW.Close()
			select {
			case ex := <-ich:
				itask.IO().Wait()
				if ex.ExitCode() != 0 || strings.TrimSpace(inOut.String()) != "3" {
					t.Errorf("stdin: code %d output %q", ex.ExitCode(), inOut.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no EOF on stdin after CloseIO")
			}
			if _, err := itask.Delete(ctx); err != nil {
				t.Fatal(err)
			}
			if err := ic.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
				t.Fatal(err)
			}

			// A detached container and its lifecycle.
			id := "life-" + sn
			if _, err := env.Ctr(ctx, "run", "-d", "--runtime", branchRuntime, "--snapshotter", sn, ociimage.ImageRef, id,
				"sh", "-c", `trap 'echo got-usr1; exit 42' USR1; while :; do sleep 0.1; done`); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "task running", 10*time.Second, func() bool { return taskStatus(t, ctx, env, id) == "RUNNING" })
			if sn == "overlayfs" {
				// The runtime runs it, but its rootfs cannot branch: a
				// fork says so, as the user's mistake (same layout as the
				// branch snapshotter's, no branch snapshotter behind it).
				out, errOut, code := branchctl(t, ctx, env, "", "--json", "fork", id)
				if code == 0 || !strings.Contains(out, `"kind": "failed-precondition"`) || !strings.Contains(out, "not made by the branch snapshotter") || !strings.Contains(out, "--snapshotter branch") {
					t.Errorf("fork of a sandbox on overlayfs: exit %d: %s%s", code, out, errOut)
				}
			}

			// Isolation, from the host: own PID and mount namespaces, own cgroup.
			c, err := client.LoadContainer(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			task, err := c.Task(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			pid := int(task.Pid())
			for _, ns := range []string{"pid", "mnt"} {
				mine, _ := os.Readlink("/proc/self/ns/" + ns)
				theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
				if err != nil || theirs == mine {
					t.Errorf("%s namespace of the container is the host's (%q, %v)", ns, theirs, err)
				}
			}
			if dirs := containerCgroupDirs(env.Namespace, id); len(dirs) == 0 {
				t.Errorf("no cgroup /%s/%s on the host", env.Namespace, id)
			}
			cgb, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if !strings.Contains(string(cgb), "/"+env.Namespace+"/"+id+"\n") {
				t.Errorf("init not in its cgroup:\n%s", cgb)
			}

			// exec without a terminal: stdout and exit code.
			out, _, code = ctrExit(ctx, env, "tasks", "exec", "--exec-id", "e1", id, "sh", "-c", "echo in-exec; exit 5")
			if code != 5 || out != "in-exec\n" {
				t.Errorf("exec: code %d out %q", code, out)
			}
			// exec with a terminal (the Go client: ctr -t needs a real tty).
			spec, err := c.Spec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pspec := *spec.Process
			pspec.Terminal = true
			// It waits for the resize below to reach its terminal.
			pspec.Args = []string{"sh", "-c", `for i in $(seq 100); do s=$(stty size); [ "$s" = "45 123" ] && break; sleep 0.05; done; echo size=$s; tty; exit 3`}
			var ttyOut syncBuffer
			proc, err := task.Exec(ctx, "tty1", &pspec, cio.NewCreator(cio.WithStreams(nil, &ttyOut, nil), cio.WithTerminal))
			if err != nil {
				t.Fatal(err)
			}
			st, err := proc.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := proc.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := proc.Resize(ctx, 123, 45); err != nil {
				t.Fatal(err)
			}
			ex := <-st
			proc.IO().Wait()
			if ex.ExitCode() != 3 || !strings.Contains(ttyOut.String(), "/dev/pts/") || !strings.Contains(ttyOut.String(), "size=45 123") {
				t.Errorf("exec with terminal: code %d output %q", ex.ExitCode(), ttyOut.String())
			}
			if _, err := proc.Delete(ctx); err != nil {
				t.Error(err)
			}

			// pids
			out, err = env.Ctr(ctx, "tasks", "ps", id)
			if err != nil || !strings.Contains(out, strconv.Itoa(pid)) {
				t.Errorf("ps: %q %v", out, err)
			}
			// pause and resume
			if _, err := env.Ctr(ctx, "tasks", "pause", id); err != nil {
				t.Fatal(err)
			}
			if s := taskStatus(t, ctx, env, id); s != "PAUSED" {
				t.Errorf("after pause: %s", s)
			}
			if _, err := env.Ctr(ctx, "tasks", "resume", id); err != nil {
				t.Fatal(err)
			}
			if s := taskStatus(t, ctx, env, id); s != "RUNNING" {
				t.Errorf("after resume: %s", s)
			}
			// stats
			metrics, err := task.Metrics(ctx)
			if err != nil || metrics == nil || metrics.Data == nil {
				t.Errorf("metrics: %v %v", metrics, err)
			}
			out, err = env.Ctr(ctx, "tasks", "metrics", id)
			if err != nil || !strings.Contains(out, "pids.current") && !strings.Contains(out, "memory") {
				t.Errorf("ctr metrics: %q %v", out, err)
			}
			// update: a memory limit lands in the cgroup.
			memLimit := int64(64 << 20)
			if err := task.Update(ctx, containerd.WithResources(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &memLimit}})); err != nil {
				t.Fatal(err)
			}
			limit := readFirst(filepath.Join("/sys/fs/cgroup/memory", env.Namespace, id, "memory.limit_in_bytes"),
				filepath.Join("/sys/fs/cgroup", env.Namespace, id, "memory.max"))
			if limit != "67108864" {
				t.Errorf("memory limit after update: %q", limit)
			}
			// kill with a chosen signal; wait sees the exit code the handler chose.
			ch, err := task.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.Ctr(ctx, "tasks", "kill", "-s", "SIGUSR1", id); err != nil {
				t.Fatal(err)
			}
			select {
			case ex := <-ch:
				if ex.ExitCode() != 42 {
					t.Errorf("exit code after SIGUSR1: %d", ex.ExitCode())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("task did not exit on SIGUSR1")
			}
			if s := taskStatus(t, ctx, env, id); s != "STOPPED" {
				t.Errorf("after exit: %s", s)
			}
			procs := containerHostProcs(env.Namespace, id, 0)
			if _, err := env.Ctr(ctx, "tasks", "delete", id); err != nil {
				t.Fatal(err)
			}
			if _, err := env.Ctr(ctx, "containers", "delete", id); err != nil {
				t.Fatal(err)
			}
			assertContainerGone(t, env, id, procs)
		})
	}
}

func readFirst(paths ...string) string {
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

// eofReader calls eof once its reader is exhausted, as ctr's stdin does to
// close the process's stdin.
type eofReader struct {
	r    io.Reader
	eof  func()
	once sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.once.Do(e.eof)
	}
	return n, err
}

// syncBuffer is a bytes.Buffer safe for the copy goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
