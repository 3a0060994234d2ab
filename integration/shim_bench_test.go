//go:build linux

package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

type benchRuntime struct{ impl, runtime string }

// benchRuntimes are the runtimes compared, on the same daemon and the same
// overlayfs snapshots: the branch runtime against containerd's runc-v2 shim
// driving Debian's runc.
func benchRuntimes() []benchRuntime {
	return []benchRuntime{{"branch", branchRuntime}, {"runc", "io.containerd.runc.v2"}}
}

// benchContainer creates a container running sleep on overlayfs with the
// given runtime, its snapshot prepared; the caller starts the task.
func benchContainer(b *testing.B, ctx context.Context, client *containerd.Client, runtime, id string) containerd.Container {
	b.Helper()
	img, err := client.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		b.Fatal(err)
	}
	c, err := client.NewContainer(ctx, id,
		containerd.WithSnapshotter("overlayfs"),
		containerd.WithNewSnapshot(id, img),
		containerd.WithRuntime(runtime, nil),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sleep", "1000")))
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// removeRuntimeRoot removes the branch runtime's state directory of the
// env's namespace once no container is left in it.
func removeRuntimeRoot(env *daemons.Env) {
	_ = os.Remove(filepath.Join(runtimeRoot, env.Namespace))
}

func benchRemove(b *testing.B, ctx context.Context, c containerd.Container, task containerd.Task) {
	b.Helper()
	if task != nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkContainerStart measures create-to-running: task create (shim
// start, rootfs mount, runtime create) and start, on a prepared snapshot.
func BenchmarkContainerStart(b *testing.B) {
	ctx, env, client, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	for _, rt := range benchRuntimes() {
		b.Run("impl="+rt.impl, func(b *testing.B) {
			i := 0
			quiesce(b)
			for b.Loop() {
				b.StopTimer()
				c := benchContainer(b, ctx, client, rt.runtime, fmt.Sprintf("start-%s-%d", rt.impl, i))
				i++
				b.StartTimer()
				task, err := c.NewTask(ctx, cio.NullIO)
				if err != nil {
					b.Fatal(err)
				}
				if err := task.Start(ctx); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				benchRemove(b, ctx, c, task)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkExec measures one exec of /bin/true in a running container, from
// exec to its exit status.
func BenchmarkExec(b *testing.B) {
	benchExec(b, []string{"true"}, func() cio.Creator { return cio.NullIO })
}

// BenchmarkExecOutput is BenchmarkExec for a process that writes a line to
// its stdout, read through a FIFO as ctr and nerdctl read it: the exit
// status waits for the output to be read (shim/drain.go).
func BenchmarkExecOutput(b *testing.B) {
	benchExec(b, []string{"echo", "x"}, func() cio.Creator { return cio.NewCreator(cio.WithStreams(nil, io.Discard, io.Discard)) })
}

func benchExec(b *testing.B, args []string, stdio func() cio.Creator) {
	ctx, env, client, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	for _, rt := range benchRuntimes() {
		b.Run("impl="+rt.impl, func(b *testing.B) {
			c := benchContainer(b, ctx, client, rt.runtime, fmt.Sprintf("exec-%s-%d", rt.impl, time.Now().UnixNano()))
			task, err := c.NewTask(ctx, cio.NullIO)
			if err != nil {
				b.Fatal(err)
			}
			defer benchRemove(b, context.WithoutCancel(ctx), c, task)
			if err := task.Start(ctx); err != nil {
				b.Fatal(err)
			}
			spec, err := c.Spec(ctx)
			if err != nil {
				b.Fatal(err)
			}
			pspec := specs.Process(*spec.Process)
			pspec.Args = args
			i := 0
			quiesce(b)
			for b.Loop() {
				proc, err := task.Exec(ctx, fmt.Sprintf("e%d", i), &pspec, stdio())
				i++
				if err != nil {
					b.Fatal(err)
				}
				ch, err := proc.Wait(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := proc.Start(ctx); err != nil {
					b.Fatal(err)
				}
				if ex := <-ch; ex.ExitCode() != 0 {
					b.Fatalf("exec exited %d", ex.ExitCode())
				}
				if _, err := proc.Delete(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkKillToReaped measures SIGKILL of a running container's task to
// containerd reporting its exit.
func BenchmarkKillToReaped(b *testing.B) {
	ctx, env, client, _ := benchEnv(b)
	defer removeRuntimeRoot(env)
	for _, rt := range benchRuntimes() {
		b.Run("impl="+rt.impl, func(b *testing.B) {
			i := 0
			quiesce(b)
			for b.Loop() {
				b.StopTimer()
				c := benchContainer(b, ctx, client, rt.runtime, fmt.Sprintf("kill-%s-%d", rt.impl, i))
				i++
				task, err := c.NewTask(ctx, cio.NullIO)
				if err != nil {
					b.Fatal(err)
				}
				ch, err := task.Wait(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := task.Start(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
					b.Fatal(err)
				}
				<-ch
				b.StopTimer()
				benchRemove(b, ctx, c, task)
				b.StartTimer()
			}
		})
	}
}
