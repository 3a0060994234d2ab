//go:build linux

package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/branchbox/branchbox/client"
	"github.com/branchbox/branchbox/internal/daemons"
)

// counterScript keeps a number that exists only in the shell's memory
// (drawn once at its start) and a count, and writes both to /count.
const counterScript = `born=$RANDOM$RANDOM$RANDOM; i=0; while :; do i=$((i+1)); echo "$born $i" > /count; sleep 0.05; done`

// waitCounter is what a counterScript container wrote last, as read
// returns it: the number it drew at its start and its count.
func waitCounter(t *testing.T, read func() (string, error)) (string, int) {
	t.Helper()
	var born string
	var n int
	waitUntil(t, "the container's count", 10*time.Second, func() bool {
		out, err := read()
		f := strings.Fields(out)
		if err != nil || len(f) != 2 {
			return false
		}
		born = f[0]
		n, err = strconv.Atoi(f[1])
		return err == nil
	})
	return born, n
}

// readCounter is waitCounter of a CRI container.
func readCounter(t *testing.T, c *criTest, ctr string) (string, int) {
	t.Helper()
	return waitCounter(t, func() (string, error) { return c.env.Crictl(c.ctx, "exec", "-s", ctr, "cat", "/count") })
}

// TestCRICheckpointContainer checkpoints a running branch container
// through the CRI as the kubelet's checkpoint API does (crictl checkpoint
// --export: containerd pauses the task, then has the runtime dump it and
// leaves it running), while the container has a live branch, and
// restores the archive into a new container of the pod (crictl create
// with the archive as its image). Before, every such checkpoint waited
// 10s and failed: the runtime had CRIU stop the paused processes with
// ptrace alone, which waits on frozen ones ("Unseizable non-zombie ...
// state D").
func TestCRICheckpointContainer(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsPod, pid: nsContainer, ipc: nsPod}
	pod, podCfg := c.runPod("ckpt", "branch", ns)
	// With the annotations a kubelet gives every container: containerd's
	// import of a checkpoint of a container that has none panics (2.2.1,
	// CRImportCheckpoint writes into their nil map).
	ctr := c.startFrom(pod, podCfg, "app", map[string]any{
		"metadata":    map[string]any{"name": "app", "attempt": 0},
		"image":       map[string]any{"image": criAppImage},
		"command":     []string{"/bin/sh", "-c", counterScript},
		"log_path":    "app.log",
		"annotations": map[string]string{"io.kubernetes.container.hash": "1", "io.kubernetes.container.restartCount": "0"},
		"linux": map[string]any{
			"security_context": map[string]any{"namespace_options": ns.options()},
		},
	})
	born, at := readCounter(t, c, ctr)

	sc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	kids := fork(t, c.ctx, sc, client.ForkOptions{Count: 1})
	mustRun(t, c.ctx, sc, kids[0].ID, "sh", "-c", "echo explored > /branch-file")

	archive := filepath.Join(c.dir, "app-checkpoint.tar")
	if _, err := c.env.Crictl(c.ctx, "checkpoint", "--export="+archive, ctr); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(archive); err != nil || fi.Size() == 0 {
		t.Fatalf("no checkpoint archive: %v", err)
	}

	// The container and its branch go on as before (the container's rootfs
	// is read-only while it has a branch: its count is in its memory only
	// until the abort).
	if s := field(c.inspect("inspect", ctr), "status", "state"); s != "CONTAINER_RUNNING" {
		t.Fatalf("container state %v after its checkpoint, want CONTAINER_RUNNING", s)
	}
	if out := mustRun(t, c.ctx, sc, kids[0].ID, "cat", "/branch-file"); out != "explored\n" {
		t.Fatalf("the branch after the checkpoint reads %q", out)
	}
	if _, err := sc.Abort(c.ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the container to count on after its checkpoint", 10*time.Second, func() bool {
		b, n := readCounter(t, c, ctr)
		return b == born && n > at
	})

	// The archive restored: the shell's memory (its number, its count from
	// where the checkpoint took it) in a new container, which branches.
	restored := c.startFrom(pod, podCfg, "restored", map[string]any{
		"metadata": map[string]any{"name": "restored", "attempt": 0},
		"image":    map[string]any{"image": archive},
		"log_path": "restored.log",
		"linux": map[string]any{
			"security_context": map[string]any{"namespace_options": ns.options()},
		},
	})
	if rt, sn := c.containerInfo(restored); rt != criBranchType || sn != "branch" {
		t.Errorf("restored container runs on runtime %q, snapshotter %q; want %s on branch", rt, sn, criBranchType)
	}
	// Its /count is the checkpoint's until the restored shell writes.
	waitUntil(t, "the restored container's shell to count on from its checkpoint", 10*time.Second, func() bool {
		b, n := readCounter(t, c, restored)
		return b == born && n > at
	})
	rc, err := client.NewSandboxClient(c.ctx, c.env.Address, daemons.CRINamespace, restored)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	kids = fork(t, c.ctx, rc, client.ForkOptions{Count: 1})
	if out := mustRun(t, c.ctx, rc, kids[0].ID, "cat", "/count"); !strings.HasPrefix(out, born+" ") {
		t.Fatalf("a branch of the restored container reads /count %q, want the shell's number %s", out, born)
	}
}

// TestCRICheckpointAcrossRuntimes restores a branch container's checkpoint
// archive into a pod of the runc handler, and a runc container's into a
// branch pod: an archive is a node's, not a runtime's (Kubernetes' restore
// from a checkpoint image may land on any node whose handler runs it).
func TestCRICheckpointAcrossRuntimes(t *testing.T) {
	c := criEnv(t)
	ns := podNS{network: nsPod, pid: nsContainer, ipc: nsPod}
	for _, h := range [][2]string{{"branch", "runc"}, {"runc", "branch"}} {
		from, to := h[0], h[1]
		t.Run(from+"-to-"+to, func(t *testing.T) {
			pod, podCfg := c.runPod("from-"+from, from, ns)
			ctr := c.startFrom(pod, podCfg, "app-"+from, map[string]any{
				"metadata":    map[string]any{"name": "app", "attempt": 0},
				"image":       map[string]any{"image": criAppImage},
				"command":     []string{"/bin/sh", "-c", counterScript},
				"log_path":    "app.log",
				"annotations": map[string]string{"io.kubernetes.container.hash": "1"},
				"linux": map[string]any{
					"security_context": map[string]any{"namespace_options": ns.options()},
				},
			})
			born, at := readCounter(t, c, ctr)
			archive := filepath.Join(c.dir, from+"-checkpoint.tar")
			if _, err := c.env.Crictl(c.ctx, "checkpoint", "--export="+archive, ctr); err != nil {
				t.Fatal(err)
			}
			toPod, toPodCfg := c.runPod("to-"+to, to, ns)
			// containerd copies the archive's container log into the pod's
			// log directory, which a kubelet makes.
			if err := os.MkdirAll(filepath.Join(c.dir, "logs", "to-"+to), 0o755); err != nil {
				t.Fatal(err)
			}
			restored := c.startFrom(toPod, toPodCfg, "restored-"+to, map[string]any{
				"metadata": map[string]any{"name": "restored", "attempt": 0},
				"image":    map[string]any{"image": archive},
				"log_path": "restored.log",
				"linux": map[string]any{
					"security_context": map[string]any{"namespace_options": ns.options()},
				},
			})
			waitUntil(t, "the restored container's shell to count on from its checkpoint", 10*time.Second, func() bool {
				b, n := readCounter(t, c, restored)
				return b == born && n > at
			})
		})
	}
}
