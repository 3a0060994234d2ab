//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
)

var checkpointSizes = []struct {
	name string
	size int
}{{"1KB", 1 << 10}, {"1MB", 1 << 20}, {"100MB", 100 << 20}}

type ckptFixture struct {
	s    *Snapshotter
	root branch.Ref
	live string
	seq  *int // names checkpoints uniquely across runs of the benchmark
}

// ckptSandbox is a mounted root snapshot over a base of files whose upper
// already holds size bytes of files (checkpointed as "base"): the change a
// benchmark makes rewrites them, so a rollback has their old content to
// bring back, not only new files to delete. written more empty files in
// one directory are in the upper too, as a sandbox that wrote them has.
func ckptSandbox(b *testing.B, ctx context.Context, files, size, written int) ckptFixture {
	b.Helper()
	requireRoot(b)
	return benchFixtures.get(b, fmt.Sprintf("ckpt-%d-%d-%d", files, size, written), func(dir string, add func(func())) (any, error) {
		s, live, err := mountedSandbox(b, ctx, dir, files, add)
		if err != nil {
			return nil, err
		}
		if written > 0 {
			tree := filepath.Join(live, "tree")
			if err := os.Mkdir(tree, 0o755); err != nil {
				return nil, err
			}
			for i := range written {
				if err := os.WriteFile(filepath.Join(tree, strconv.Itoa(i+1)), nil, 0o644); err != nil {
					return nil, err
				}
			}
		}
		writeChangeByte(b, live, size, 1)
		root := branch.Ref{Root: branch.Root{Key: "sandbox"}}
		if _, err := s.Checkpoint(ctx, root, "base"); err != nil {
			return nil, err
		}
		unix.Sync()
		return ckptFixture{s: s, root: root, live: live, seq: new(int)}, nil
	}).(ckptFixture)
}

// writeChangeByte rewrites size bytes of files under dir/change (1 MiB each
// at most) with content that depends on v.
func writeChangeByte(b *testing.B, dir string, size int, v byte) {
	b.Helper()
	chunk := make([]byte, min(size, 1<<20))
	for i := range chunk {
		chunk[i] = byte(i*7) + v
	}
	if err := os.MkdirAll(filepath.Join(dir, "change"), 0o755); err != nil {
		b.Fatal(err)
	}
	for i := 0; size > 0; i++ {
		n := min(size, len(chunk))
		if err := os.WriteFile(filepath.Join(dir, "change", fmt.Sprintf("part%03d", i)), chunk[:n], 0o644); err != nil {
			b.Fatal(err)
		}
		size -= n
	}
}

// BenchmarkCheckpoint: a checkpoint of a mounted, running rootfs after a
// change of size bytes since its previous checkpoint, by base size. Against
// copying the whole rootfs (cp -a of a plain tree of the same files plus
// the change); containerd's diff service is in the integration package.
func BenchmarkCheckpoint(b *testing.B) {
	ctx := context.Background()
	for _, files := range []int{10000, 100000} {
		for _, sz := range checkpointSizes {
			b.Run(fmt.Sprintf("files=%d/size=%s", files, sz.name), func(b *testing.B) {
				b.Run("impl=branch", func(b *testing.B) {
					f := ckptSandbox(b, ctx, files, sz.size, 0)
					prev := ""
					for b.Loop() {
						b.StopTimer()
						*f.seq++
						writeChangeByte(b, f.live, sz.size, byte(*f.seq+1))
						name := fmt.Sprintf("c%d", *f.seq)
						b.StartTimer()
						if _, err := f.s.Checkpoint(ctx, f.root, name); err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						// Keep "base" and the newest, as an agent that saves
						// every step and keeps the last would: the records stay
						// few whatever b.N is (and the rollback benchmark,
						// which shares this sandbox, is not timed against
						// thousands of them).
						if prev != "" {
							if err := f.s.DeleteCheckpoint(ctx, f.root.Root, prev); err != nil {
								b.Fatal(err)
							}
						}
						prev = name
						b.StartTimer()
					}
				})
				b.Run("impl=cp-a", func(b *testing.B) { benchCopyTree(b, files, sz.size) })
			})
		}
	}
}

// BenchmarkRollback: rollback of a mounted, running rootfs to a checkpoint
// after rewriting size bytes of files it holds, through the live mount.
// Against copying the rootfs back (cp -a of the whole saved tree).
func BenchmarkRollback(b *testing.B) {
	ctx := context.Background()
	for _, files := range []int{10000, 100000} {
		for _, sz := range checkpointSizes {
			b.Run(fmt.Sprintf("files=%d/size=%s", files, sz.name), func(b *testing.B) {
				b.Run("impl=branch", func(b *testing.B) { benchRollback(b, ctx, ckptSandbox(b, ctx, files, sz.size, 0), sz.size) })
				b.Run("impl=cp-a", func(b *testing.B) { benchCopyTree(b, files, sz.size) })
			})
		}
	}
}

// benchCopyTree copies a whole rootfs of files plus size bytes of change.
func benchCopyTree(b *testing.B, files, size int) {
	src := benchFixtures.get(b, fmt.Sprintf("plainchange-%d-%d", files, size), func(dir string, _ func(func())) (any, error) {
		makeTree(b, dir, files)
		writeChangeByte(b, dir, size, 1)
		unix.Sync()
		return dir, nil
	}).(string)
	dst := filepath.Join(b.TempDir(), "copy")
	for b.Loop() {
		if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp -a: %v %s", err, out)
		}
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	}
}

// BenchmarkRollbackWrittenUpper: rollback of a sandbox that wrote 10,000
// files into one directory itself (they are in its upper, as in
// BenchmarkTail's sandbox), to a checkpoint taken after that, following a
// 1 KB change: finding the change costs a stat per entry of the upper.
func BenchmarkRollbackWrittenUpper(b *testing.B) {
	ctx := context.Background()
	benchRollback(b, ctx, ckptSandbox(b, ctx, 1000, 1<<10, 10000), 1<<10)
}

// benchRollback times rollbacks of f to "base", each after rewriting size
// bytes of its files.
func benchRollback(b *testing.B, ctx context.Context, f ckptFixture, size int) {
	i := 0
	for b.Loop() {
		b.StopTimer()
		i++
		writeChangeByte(b, f.live, size, byte(i+1))
		b.StartTimer()
		if err := f.s.Rollback(ctx, f.root, "base"); err != nil {
			b.Fatal(err)
		}
	}
}
