//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

var ckptBenchSizes = []struct {
	name string
	size int
}{{"1KB", 1 << 10}, {"1MB", 1 << 20}, {"100MB", 100 << 20}}

// diffFixture is containerd's way to save and restore a container's
// rootfs: on the overlayfs snapshotter, a committed base (the image plus
// files small files), a view of it (the diff's lower), and a mounted active
// snapshot over it (the running container) holding size bytes of files.
type diffFixture struct {
	lower []mount.Mount
	upper []mount.Mount
	live  string
	base  string
	desc  ocispec.Descriptor
}

func diffSetup(b *testing.B, ctx context.Context, client *containerd.Client, chainID string, files, size int) *diffFixture {
	b.Helper()
	key := fmt.Sprintf("%d-%d", files, size)
	if f, ok := bench.diff[key]; ok {
		return f
	}
	if bench.diff == nil {
		bench.diff = map[string]*diffFixture{}
	}
	sn := client.SnapshotService("overlayfs")
	f := &diffFixture{base: "ckb-base-" + key}
	m, err := sn.Prepare(ctx, f.base+"-active", chainID)
	if err != nil {
		b.Fatal(err)
	}
	mnt, err := os.MkdirTemp("", "ckb-base-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(mnt)
	if err := mount.All(m, mnt); err != nil {
		b.Fatal(err)
	}
	writeFiles(b, mnt, files)
	writeBytes(b, mnt, size, 1)
	if err := mount.UnmountAll(mnt, 0); err != nil {
		b.Fatal(err)
	}
	if err := sn.Commit(ctx, f.base, f.base+"-active"); err != nil {
		b.Fatal(err)
	}
	if f.lower, err = sn.View(ctx, f.base+"-view", f.base); err != nil {
		b.Fatal(err)
	}
	up, err := sn.Prepare(ctx, "ckb-live-"+key, f.base)
	if err != nil {
		b.Fatal(err)
	}
	f.upper = up
	f.live = filepath.Join(os.TempDir(), "ckb-live-"+key)
	os.MkdirAll(f.live, 0o700)
	if err := mount.All(up, f.live); err != nil {
		b.Fatal(err)
	}
	bench.cleanups = append(bench.cleanups, func() {
		mount.UnmountAll(f.live, unix.MNT_DETACH)
		os.Remove(f.live)
	})
	unix.Sync()
	bench.diff[key] = f
	return f
}

func writeFiles(b *testing.B, dir string, files int) {
	b.Helper()
	for i := 0; i < files; i++ {
		d := filepath.Join(dir, "tree", fmt.Sprintf("d%04d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d", i%100)), []byte("some file content of about a hundred bytes, like a small source file or config\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

func writeBytes(b *testing.B, dir string, size int, v byte) {
	b.Helper()
	chunk := make([]byte, min(size, 1<<20))
	for i := range chunk {
		chunk[i] = byte(i*7) + v
	}
	os.MkdirAll(filepath.Join(dir, "change"), 0o755)
	for i := 0; size > 0; i++ {
		n := min(size, len(chunk))
		if err := os.WriteFile(filepath.Join(dir, "change", fmt.Sprintf("part%03d", i)), chunk[:n], 0o644); err != nil {
			b.Fatal(err)
		}
		size -= n
	}
}

// BenchmarkCheckpoint (containerd's diff service): a checkpoint is the
// diff of the running container's rootfs against its base
// (DiffService().Compare, a layer tarball in the content store). The
// branch figures are in the snapshotter package's benchmark of this name.
func BenchmarkCheckpoint(b *testing.B) {
	ctx, _, client, chainID := benchEnv(b)
	ctx, done, err := client.WithLease(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer done(context.Background())
	for _, files := range []int{10000, 100000} {
		for _, sz := range ckptBenchSizes {
			b.Run(fmt.Sprintf("files=%d/size=%s/impl=containerd-diff", files, sz.name), func(b *testing.B) {
				f := diffSetup(b, ctx, client, chainID, files, sz.size)
				i := 0
				quiesce(b)
				for b.Loop() {
					b.StopTimer()
					i++
					writeBytes(b, f.live, sz.size, byte(i+1))
					b.StartTimer()
					desc, err := client.DiffService().Compare(ctx, f.lower, f.upper)
					if err != nil {
						b.Fatal(err)
					}
					f.desc = desc
				}
			})
		}
	}
}

// BenchmarkRollback (containerd's diff service): restoring is applying the
// saved diff to a fresh snapshot of the base (Prepare, then
// DiffService().Apply).
func BenchmarkRollback(b *testing.B) {
	ctx, _, client, chainID := benchEnv(b)
	ctx, done, err := client.WithLease(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer done(context.Background())
	sn := client.SnapshotService("overlayfs")
	for _, files := range []int{10000, 100000} {
		for _, sz := range ckptBenchSizes {
			b.Run(fmt.Sprintf("files=%d/size=%s/impl=containerd-diff", files, sz.name), func(b *testing.B) {
				f := diffSetup(b, ctx, client, chainID, files, sz.size)
				writeBytes(b, f.live, sz.size, 2)
				desc, err := client.DiffService().Compare(ctx, f.lower, f.upper)
				if err != nil {
					b.Fatal(err)
				}
				i := 0
				quiesce(b)
				for b.Loop() {
					i++
					key := fmt.Sprintf("ckb-restore-%d-%s-%d", files, sz.name, i)
					m, err := sn.Prepare(ctx, key, f.base)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := client.DiffService().Apply(ctx, desc, m); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := sn.Remove(ctx, key); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}
