//go:build linux

package integration

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/branchbox/branchbox/internal/ociimage"
)

// slowWriter takes what a FIFO's copy gives it, sleeping on its first
// write: what the copy has not read yet stays in the FIFO meanwhile, as it
// does for a client that a loaded machine does not schedule.
type slowWriter struct {
	once sync.Once
	syncBuffer
}

func (w *slowWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { time.Sleep(500 * time.Millisecond) })
	return w.syncBuffer.Write(p)
}

// TestExitWaitsForOutputRead: a client that deletes a process as soon as
// its Wait returns, as ctr 2.2 and nerdctl do, gets all of its output.
// containerd's client closes its ends of the process's FIFOs in Delete
// before it waits for their copies, so output still in a FIFO was lost
// (under load, ctr printed nothing for a process that wrote); the shim's
// Wait now returns once the FIFOs have been read. The process writes 60
// KB: the client's copy reads 32 KB, then sleeps in its writer while the
// rest waits in the FIFO. For an exec in a running container and for a
// container's own process (ctr run --rm).
func TestExitWaitsForOutputRead(t *testing.T) {
	ctx, _, client := shimEnv(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	img, err := client.GetImage(ctx, ociimage.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	const write = "head -c 60000 /dev/zero | tr '\\0' x"
	want := strings.Repeat("x", 60000)
	newContainer := func(id string, args ...string) containerd.Container {
		c, err := client.NewContainer(ctx, id, containerd.WithSnapshotter("overlayfs"), containerd.WithNewSnapshot(id, img),
			containerd.WithRuntime(branchRuntime, nil), containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(args...)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	t.Run("exec", func(t *testing.T) {
		c := newContainer("drain-exec", "sleep", "600")
		task, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		spec, err := c.Spec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			ps := *spec.Process
			ps.Args = []string{"sh", "-c", write}
			var out slowWriter
			p, err := task.Exec(ctx, "w"+string(rune('0'+i)), &ps, cio.NewCreator(cio.WithStreams(nil, &out, io.Discard)))
			if err != nil {
				t.Fatal(err)
			}
			exit, err := p.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			<-exit
			if _, err := p.Delete(ctx); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != want {
				t.Fatalf("exec %d: got %d bytes of its 60,000 when deleted at its exit", i, len(got))
			}
		}
	})

	t.Run("init", func(t *testing.T) {
		c := newContainer("drain-init", "sh", "-c", write)
		var out slowWriter
		task, err := c.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &out, io.Discard)))
		if err != nil {
			t.Fatal(err)
		}
		exit, err := task.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
		<-exit
		if _, err := task.Delete(ctx); err != nil {
			t.Fatal(err)
		}
		if got := out.String(); got != want {
			t.Fatalf("a container's process: got %d bytes of its 60,000 when deleted at its exit", len(got))
		}
	})
}
