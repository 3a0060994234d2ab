//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// nerdctlHook stands in for `nerdctl internal oci-hook EVENT`, which
// nerdctl puts in every container's spec as a createRuntime and a
// postStop hook (its network setup and teardown): it records the event
// and the container state the runtime passes on stdin.
const nerdctlHook = `#!/bin/sh
# argv: internal oci-hook EVENT; HOOK_DIR comes from the hook's env.
/bin/cat > "$HOOK_DIR/$3.json"
`

// nerdctlLogger stands in for nerdctl as the shim's binary logger
// (`binary://nerdctl?_NERDCTL_INTERNAL_LOGGING=DATASTORE`): the shim runs it
// with the container's stdout on fd 3, stderr on fd 4 and a pipe on fd 5
// to close once ready, and with no PATH. It appends, as nerdctl's
// json-file logger does.
const nerdctlLogger = `#!/bin/sh
[ "$1" = _NERDCTL_INTERNAL_LOGGING ] || exit 2
d="$2/$CONTAINER_NAMESPACE/$CONTAINER_ID"
/bin/mkdir -p "$d"
# The readers must not hold the ready pipe open.
/bin/cat <&3 >> "$d/stdout" 5>&- &
/bin/cat <&4 >> "$d/stderr" 5>&- &
exec 3<&- 4<&- 5>&-
wait
`

// TestNerdctlStyleContainer makes a container the way `nerdctl run -d
// --snapshotter branch --runtime io.containerd.branch.v1` makes it
// (nerdctl's pkg/cmd/container/create.go, reproduced through the containerd
// Go client since nerdctl cannot be built here): the image unpacked into
// the snapshotter named, no runtime options for a runtime outside
// io.containerd.runc.*, nerdctl's labels on the container and copied into
// the spec's annotations, its OCI hooks, and a binary log URI. The
// container must run, log, exec, stop and go away as under runc-v2, with
// both hooks run.
func TestNerdctlStyleContainer(t *testing.T) {
	ctx, env := startEnv(t)
	id := "nerdctl-style"
	ns := newNerdctlStyle(t, ctx, env, id, `trap 'echo stopping >&2; exit 0' TERM; echo hello from nerdctl; sleep 1000 & wait`)
	ctx, client, container, spec := ns.ctx, ns.client, ns.container, ns.spec
	hookDir, dataStore, nerdctlLabels, logURI := ns.hookDir, ns.dataStore, ns.labels, ns.logURI
	info, err := container.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o := info.Runtime.Options; info.Runtime.Name != branchRuntime || (o != nil && len(o.GetValue()) != 0) || info.Snapshotter != "branch" {
		t.Errorf("container record: runtime %q options %v snapshotter %q", info.Runtime.Name, info.Runtime.Options, info.Snapshotter)
	}
	for k, v := range nerdctlLabels {
		if info.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, info.Labels[k], v)
		}
	}
	if spec.Annotations["nerdctl/name"] != "agent-1" {
		t.Errorf("spec annotations lack nerdctl's labels: %v", spec.Annotations)
	}

	task, err := container.NewTask(ctx, cio.LogURI(logURI))
	if err != nil {
		t.Fatal(err)
	}
	// createRuntime ran in the runtime's namespace, given the state.
	var state specs.State
	readHook(t, hookDir, "createRuntime", &state)
	if state.ID != id || state.Pid != int(task.Pid()) || state.Annotations["nerdctl/name"] != "agent-1" {
		t.Errorf("createRuntime hook state: id %q pid %d annotations %v; want %s, %d, nerdctl's labels", state.ID, state.Pid, state.Annotations, id, task.Pid())
	}
	exitCh, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	procs := containerHostProcs(env.Namespace, id, int(task.Pid()))
	logDir := filepath.Join(dataStore, env.Namespace, id)
	waitUntil(t, "the binary logger to get the container's stdout", 10*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(logDir, "stdout"))
		return strings.Contains(string(b), "hello from nerdctl")
	})

	// nerdctl exec: a process with its own stdio on the same task.
	var out, errOut bytes.Buffer // one writer each
	pspec := *spec.Process
	pspec.Args = []string{"sh", "-c", "hostname; echo to stderr >&2"}
	p, err := task.Exec(ctx, "exec-1", &pspec, cio.NewCreator(cio.WithStreams(nil, &out, &errOut)))
	if err != nil {
		t.Fatal(err)
	}
	pexit, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st := <-pexit; st.ExitCode() != 0 {
		t.Errorf("exec exit %d", st.ExitCode())
	}
	p.IO().Wait()
	if _, err := p.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if out.String() != "agent-1\n" || errOut.String() != "to stderr\n" {
		t.Errorf("exec: stdout %q, stderr %q; want the hostname nerdctl set and the stderr line", out.String(), errOut.String())
	}

	// nerdctl stop: the image's stop signal (the label containerd set).
	if info, err = container.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if info.Labels[containerd.StopSignalLabel] != "SIGTERM" {
		t.Errorf("stop signal label %q", info.Labels[containerd.StopSignalLabel])
	}
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-exitCh:
		if st.ExitCode() != 0 {
			t.Errorf("exit %d after SIGTERM, want 0 (the trap)", st.ExitCode())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit within 10s of SIGTERM")
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(logDir, "stderr")); !strings.Contains(string(b), "stopping") {
		t.Errorf("binary logger's stderr: %q", b)
	}
	readHook(t, hookDir, "postStop", &state)
	if state.ID != id {
		t.Errorf("postStop hook state id %q", state.ID)
	}
	if err := container.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	assertContainerGone(t, env, id, procs)
	if _, err := client.SnapshotService("branch").Stat(ctx, id); err == nil {
		t.Error("the container's snapshot is left")
	}
}

// nerdctlStyle is a container made as nerdctl makes it (see
// TestNerdctlStyleContainer), not yet with a task.
type nerdctlStyle struct {
	ctx                context.Context // in the env's namespace
	client             *containerd.Client
	container          containerd.Container
	spec               specs.Spec
	hookDir, dataStore string
	labels             map[string]string
	logURI             *url.URL
}

// newNerdctlStyle makes container id the way nerdctl run does, running
// the shell command cmd, with nerdctl's hooks (recording each event in
// hookDir) and binary logger (keeping its output under dataStore).
func newNerdctlStyle(t *testing.T, ctx context.Context, env *daemons.Env, id, cmd string) *nerdctlStyle {
	t.Helper()
	importImage(t, ctx, env, "overlayfs") // nerdctl's own pulls unpack elsewhere first
	client, err := containerd.New(env.Address)
	if err != nil {
		t.Fatal(err)
	}
	ctx = namespaces.WithNamespace(ctx, env.Namespace)
	t.Cleanup(func() {
		cctx := namespaces.WithNamespace(context.Background(), env.Namespace)
		if c, err := client.LoadContainer(cctx, id); err == nil {
			if task, err := c.Task(cctx, nil); err == nil {
				_, _ = task.Delete(cctx, containerd.WithProcessKill)
			}
			_ = c.Delete(cctx, containerd.WithSnapshotCleanup)
		}
		client.Close()
		killLeftovers(t, env.Namespace)
		if err := os.Remove(filepath.Join(runtimeRoot, env.Namespace)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("runtime state left: %v", err)
			_ = os.RemoveAll(filepath.Join(runtimeRoot, env.Namespace))
		}
	})

	dir := t.TempDir()
	dataStore, hookDir := filepath.Join(dir, "nerdctl"), filepath.Join(dir, "hooks")
	for _, d := range []string{dataStore, hookDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	hook, logger := filepath.Join(dir, "nerdctl-hook"), filepath.Join(dir, "nerdctl-logger")
	if err := os.WriteFile(hook, []byte(nerdctlHook), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logger, []byte(nerdctlLogger), 0o755); err != nil {
		t.Fatal(err)
	}

	// EnsureImage: nerdctl unpacks an image it already has into the
	// snapshotter asked for when it is not unpacked there.
	img, err := client.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := img.IsUnpacked(ctx, "branch"); err != nil || ok {
		t.Fatalf("image unpacked into branch before nerdctl's unpack (%v, %v)", ok, err)
	}
	if err := img.Unpack(ctx, "branch"); err != nil {
		t.Fatal(err)
	}

	logURI, err := cio.LogURIGenerator("binary", logger, map[string]string{"_NERDCTL_INTERNAL_LOGGING": dataStore})
	if err != nil {
		t.Fatal(err)
	}
	platform := "linux/" + runtime.GOARCH
	nerdctlLabels := map[string]string{
		"nerdctl/namespace":  env.Namespace,
		"nerdctl/name":       "agent-1",
		"nerdctl/hostname":   "agent-1",
		"nerdctl/extraHosts": "null",
		"nerdctl/state-dir":  filepath.Join(dataStore, "containers", env.Namespace, id),
		"nerdctl/networks":   `["none"]`,
		"nerdctl/log-uri":    logURI.String(),
		"nerdctl/platform":   platform,
	}
	hookArgs := []string{hook, "internal", "oci-hook"}
	hookEnv := []string{"HOOK_DIR=" + hookDir, "PATH=/usr/bin:/bin"}
	withHooks := func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if s.Hooks == nil {
			s.Hooks = &specs.Hooks{}
		}
		s.Hooks.CreateRuntime = append(s.Hooks.CreateRuntime, specs.Hook{Path: hook, Args: append(append([]string{}, hookArgs...), "createRuntime"), Env: hookEnv})
		s.Hooks.Poststop = append(s.Hooks.Poststop, specs.Hook{Path: hook, Args: append(append([]string{}, hookArgs...), "postStop"), Env: hookEnv})
		return nil
	}
	// nerdctl copies the container's labels into the spec's annotations.
	withLabelAnnotations := func(ctx context.Context, oc oci.Client, c *containers.Container, s *specs.Spec) error {
		return oci.WithAnnotations(c.Labels)(ctx, oc, c, s)
	}
	ns := &nerdctlStyle{ctx: ctx, client: client, hookDir: hookDir, dataStore: dataStore, labels: nerdctlLabels, logURI: logURI}
	ns.container, err = client.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithSnapshotter("branch"),
		containerd.WithNewSnapshot(id, img),
		containerd.WithImageStopSignal(img, "SIGTERM"),
		containerd.WithRuntime(branchRuntime, nil), // no options: nerdctl's choice for non-runc runtimes
		containerd.WithAdditionalContainerLabels(nerdctlLabels),
		containerd.WithSpec(&ns.spec,
			oci.WithDefaultSpec(),
			oci.WithImageConfigArgs(img, []string{"sh", "-c", cmd}),
			oci.WithHostname("agent-1"),
			withHooks,
			withLabelAnnotations,
		),
	)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// readHook waits for the hook script's record of event and decodes it.
func readHook(t *testing.T, dir, event string, v any) {
	t.Helper()
	var b []byte
	waitUntil(t, "the "+event+" hook", 10*time.Second, func() bool {
		var err error
		b, err = os.ReadFile(filepath.Join(dir, event+".json"))
		return err == nil && len(b) > 0 && json.Valid(b)
	})
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s hook state: %v\n%s", event, err, b)
	}
}
