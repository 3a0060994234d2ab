//go:build linux

package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/branchbox/branchbox/internal/ociimage"
)

// TestShimBadInput checks that bad requests fail with errors of the right
// errdefs kind, through containerd, that say what failed, and leave nothing
// behind: a broken spec, a missing rootfs, an unknown exec id, signals to an
// exited exec and an exited task, exec into a stopped task.
func TestShimBadInput(t *testing.T) {
	ctx, env, client := shimEnv(t)
	img, err := client.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	newContainer := func(t *testing.T, id string, opts ...containerd.NewContainerOpts) containerd.Container {
		t.Helper()
		c, err := client.NewContainer(ctx, id, append([]containerd.NewContainerOpts{containerd.WithRuntime(branchRuntime, nil)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup) })
		return c
	}
	wantKind := func(t *testing.T, err error, kind func(error) bool, kindName, text string) {
		t.Helper()
		if err == nil {
			t.Fatalf("want a %s error, got none", kindName)
		}
		if !kind(err) {
			t.Errorf("want a %s error, got %v", kindName, err)
		}
		if !strings.Contains(err.Error(), text) {
			t.Errorf("error %q does not say %q", err, text)
		}
	}

	t.Run("broken spec", func(t *testing.T) {
		c := newContainer(t, "bad-spec", containerd.WithSnapshotter("branch"), containerd.WithNewSnapshot("bad-spec", img),
			containerd.WithNewSpec(oci.WithImageConfig(img), func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
				s.Process.Args = nil
				return nil
			}))
		_, err := c.NewTask(ctx, cio.NullIO)
		wantKind(t, err, errdefs.IsInvalidArgument, "invalid argument", "spec process has no args")
		assertContainerGone(t, env, "bad-spec", nil)
	})
	t.Run("relative cwd", func(t *testing.T) {
		c := newContainer(t, "bad-cwd", containerd.WithSnapshotter("overlayfs"), containerd.WithNewSnapshot("bad-cwd", img),
			containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessCwd("tmp")))
		_, err := c.NewTask(ctx, cio.NullIO)
		wantKind(t, err, errdefs.IsInvalidArgument, "invalid argument", `cwd "tmp" is not absolute`)
		assertContainerGone(t, env, "bad-cwd", nil)
	})
	t.Run("missing rootfs", func(t *testing.T) {
		// No snapshot: no rootfs mounts, and the spec's rootfs does not exist.
		c := newContainer(t, "no-rootfs", containerd.WithNewSpec(oci.WithRootFSPath("/nonexistent-branchbox-rootfs"), oci.WithProcessArgs("true")))
		_, err := c.NewTask(ctx, cio.NullIO)
		wantKind(t, err, errdefs.IsNotFound, "not found", "no such directory")
		assertContainerGone(t, env, "no-rootfs", nil)
	})
	t.Run("exec and signals", func(t *testing.T) {
		id := "bad-exec"
		c := newContainer(t, id, containerd.WithSnapshotter("branch"), containerd.WithNewSnapshot(id, img),
			containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sleep", "1000")))
		task, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		procs := containerHostProcs(env.Namespace, id, int(task.Pid()))
		// An unknown exec id.
		_, err = task.LoadProcess(ctx, "nope", nil)
		wantKind(t, err, errdefs.IsNotFound, "not found", "nope")
		_, err = env.Ctr(ctx, "tasks", "kill", "--exec-id", "nope", id)
		if err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("ctr kill of an unknown exec id: %v", err)
		}
		// A signal to an exec that has exited.
		spec, err := c.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pspec := *spec.Process
		pspec.Args = []string{"true"}
		proc, err := task.Exec(ctx, "short", &pspec, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := proc.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := proc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		<-ch
		err = proc.Kill(ctx, syscall.SIGTERM)
		wantKind(t, err, errdefs.IsNotFound, "not found", "process already finished")
		// A signal to a task that has exited, and exec into it.
		ch, err = task.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("task did not exit")
		}
		err = task.Kill(ctx, syscall.SIGTERM)
		wantKind(t, err, errdefs.IsNotFound, "not found", "process already finished")
		pspec.Args = []string{"true"}
		_, err = task.Exec(ctx, "late", &pspec, cio.NullIO)
		wantKind(t, err, errdefs.IsFailedPrecondition, "failed precondition", "container is stopped")
		if _, err := task.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		assertContainerGone(t, env, id, procs)
	})
}
