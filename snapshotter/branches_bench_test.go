//go:build linux

package snapshotter

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/branch"
)

// makeTree writes files small files, 100 to a directory.
func makeTree(b *testing.B, dir string, files int) {
	b.Helper()
	for i := 0; i < files; i++ {
		d := filepath.Join(dir, fmt.Sprintf("d%04d", i/100))
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

// benchBase commits a base layer of files into sn and returns its name.
func benchBase(b *testing.B, ctx context.Context, sn snapshots.Snapshotter, files int) string {
	b.Helper()
	m, err := sn.Prepare(ctx, "base-active", "")
	if err != nil {
		b.Fatal(err)
	}
	makeTree(b, m[0].Source, files)
	if err := sn.Commit(ctx, "base", "base-active"); err != nil {
		b.Fatal(err)
	}
	// A sandbox's image is on disk long before anyone forks it: write the
	// base out now, or the first seal (a read-only remount syncs the
	// filesystem) would pay for writing it.
	unix.Sync()
	return "base"
}

// fixtures keeps the expensive benchmark set-ups (trees of up to 100,000
// files) for the whole test binary: the benchmark framework calls each
// benchmark function several times while it sizes b.N.
type fixtures struct {
	mu       sync.Mutex
	dir      string
	cleanups []func()
	items    map[string]any
}

var benchFixtures fixtures

// get returns the fixture named key, making it with mk on first use; mk
// registers its own cleanup with add.
func (f *fixtures) get(b *testing.B, key string, mk func(dir string, add func(func())) (any, error)) any {
	b.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.items[key]; ok {
		return v
	}
	if f.items == nil {
		f.items = map[string]any{}
		d, err := os.MkdirTemp("", "branch-bench-")
		if err != nil {
			b.Fatal(err)
		}
		f.dir = d
	}
	dir, err := os.MkdirTemp(f.dir, "f-")
	if err != nil {
		b.Fatal(err)
	}
	v, err := mk(dir, func(fn func()) { f.cleanups = append(f.cleanups, fn) })
	if err != nil {
		b.Fatal(err)
	}
	f.items[key] = v
	return v
}

func (f *fixtures) close() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	if f.dir != "" {
		os.RemoveAll(f.dir)
	}
}

func TestMain(m *testing.M) {
	// Every fork and abort logs at info; thousands of benchmark iterations
	// would time the logger.
	if err := log.SetLevel("warn"); err != nil {
		panic(err)
	}
	code := m.Run()
	benchFixtures.close()
	os.Exit(code)
}

type sandboxFixture struct {
	s    *Snapshotter
	root branch.Ref
}

// mountedSandbox makes a snapshotter in dir with a root snapshot "sandbox"
// over a base of files, mounted at dir/mnt; add registers the cleanups.
func mountedSandbox(b *testing.B, ctx context.Context, dir string, files int, add func(func())) (*Snapshotter, string, error) {
	s, err := New(ctx, filepath.Join(dir, "root"))
	if err != nil {
		return nil, "", err
	}
	add(func() { s.Close() })
	base := benchBase(b, ctx, s, files)
	m, err := s.Prepare(ctx, "sandbox", base)
	if err != nil {
		return nil, "", err
	}
	target := filepath.Join(dir, "mnt")
	if err := os.Mkdir(target, 0o700); err != nil {
		return nil, "", err
	}
	if err := mount.All(m, target); err != nil {
		return nil, "", err
	}
	add(func() { mount.UnmountAll(target, unix.MNT_DETACH) })
	return s, target, nil
}

// benchSandbox is a mounted root snapshot over a base of files, as a
// running container's rootfs would be.
func benchSandbox(b *testing.B, ctx context.Context, files int) (*Snapshotter, branch.Ref) {
	b.Helper()
	requireRoot(b)
	v := benchFixtures.get(b, fmt.Sprintf("sandbox-%d", files), func(dir string, add func(func())) (any, error) {
		s, _, err := mountedSandbox(b, ctx, dir, files, add)
		if err != nil {
			return nil, err
		}
		return sandboxFixture{s: s, root: branch.Ref{Root: branch.Root{Key: "sandbox"}}}, nil
	}).(sandboxFixture)
	return v.s, v.root
}

// overlayBase is containerd's overlayfs snapshotter with the same base.
func overlayBase(b *testing.B, ctx context.Context, files int) (snapshots.Snapshotter, string) {
	b.Helper()
	requireRoot(b)
	sn := benchFixtures.get(b, fmt.Sprintf("overlay-%d", files), func(dir string, add func(func())) (any, error) {
		sn, err := overlay.NewSnapshotter(dir)
		if err != nil {
			return nil, err
		}
		add(func() { sn.Close() })
		benchBase(b, ctx, sn, files)
		return sn, nil
	}).(snapshots.Snapshotter)
	return sn, "base"
}

// plainTree is a directory of files, for cp -a.
func plainTree(b *testing.B, files int) string {
	b.Helper()
	return benchFixtures.get(b, fmt.Sprintf("plain-%d", files), func(dir string, _ func(func())) (any, error) {
		makeTree(b, dir, files)
		unix.Sync()
		return dir, nil
	}).(string)
}

// BenchmarkFork: fork of one child of a mounted, running sandbox rootfs, by
// base size. Against containerd's overlayfs Prepare on the same base (what
// starting a fresh container costs) and cp -a of the base (fork by copy).
func BenchmarkFork(b *testing.B) {
	ctx := context.Background()
	for _, files := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			b.Run("impl=branch", func(b *testing.B) { benchFork(b, ctx, files, 1) })
			b.Run("impl=overlayfs", func(b *testing.B) {
				sn, base := overlayBase(b, ctx, files)
				i := 0
				for b.Loop() {
					key := fmt.Sprintf("c%d", i)
					i++
					if _, err := sn.Prepare(ctx, key, base); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := sn.Remove(ctx, key); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
			b.Run("impl=cp-a", func(b *testing.B) {
				src := plainTree(b, files)
				dst := filepath.Join(b.TempDir(), "copy")
				for b.Loop() {
					if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
						b.Fatalf("cp -a: %v %s", err, out)
					}
					b.StopTimer()
					os.RemoveAll(dst)
					b.StartTimer()
				}
				// Written out before the next benchmark, whose seals would
				// otherwise pay for the copies' writeback.
				unix.Sync()
			})
		})
	}
}

// BenchmarkForkEight: one fork call making 8 children, per child (ns/child)
// and in all (ns/op), by base size.
func BenchmarkForkEight(b *testing.B) {
	ctx := context.Background()
	for _, files := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			b.Run("impl=branch", func(b *testing.B) { benchFork(b, ctx, files, 8) })
		})
	}
}

// benchFork forks n children of a mounted sandbox per iteration and aborts
// them untimed, reporting the time per child too.
func benchFork(b *testing.B, ctx context.Context, files, n int) {
	s, root := benchSandbox(b, ctx, files)
	for b.Loop() {
		kids, err := s.Fork(ctx, root, n)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for _, k := range kids {
			if _, err := s.Abort(ctx, branch.Ref{Root: root.Root, Branch: k.ID}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/child")
}

var commitSizes = []struct {
	name string
	size int
}{{"1KB", 1 << 10}, {"100KB", 100 << 10}, {"1MB", 1 << 20}, {"100MB", 100 << 20}}

// writeChange writes size bytes of new files (1 MiB each at most) into dir.
func writeChange(b *testing.B, dir string, size int) {
	b.Helper()
	chunk := make([]byte, min(size, 1<<20))
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
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

// BenchmarkCommit: commit of a branch holding size bytes of new files into
// its mounted parent (through the parent's live mount), on a 10,000-file
// base. Against cp -a of the same change into a directory.
func BenchmarkCommit(b *testing.B) {
	ctx := context.Background()
	for _, sz := range commitSizes {
		b.Run("size="+sz.name, func(b *testing.B) {
			b.Run("impl=branch", func(b *testing.B) {
				s, root := benchSandbox(b, ctx, 10000)
				for b.Loop() {
					b.StopTimer()
					kids, err := s.Fork(ctx, root, 1)
					if err != nil {
						b.Fatal(err)
					}
					writeChange(b, upperOf(b, kids[0].Mounts), sz.size)
					b.StartTimer()
					if _, err := s.CommitBranch(ctx, branch.Ref{Root: root.Root, Branch: kids[0].ID}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("impl=cp-a", func(b *testing.B) {
				src := b.TempDir()
				writeChange(b, src, sz.size)
				dst := b.TempDir()
				for b.Loop() {
					if out, err := exec.Command("cp", "-a", src+"/.", dst+"/").CombinedOutput(); err != nil {
						b.Fatalf("cp -a: %v %s", err, out)
					}
					b.StopTimer()
					os.RemoveAll(filepath.Join(dst, "change"))
					b.StartTimer()
				}
				unix.Sync() // as in BenchmarkFork
			})
		})
	}
}

// BenchmarkAbort: abort of a branch holding one small change. Against
// containerd's overlayfs Remove of an active snapshot with the same change.
func BenchmarkAbort(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=branch", func(b *testing.B) {
		s, root := benchSandbox(b, ctx, 10000)
		for b.Loop() {
			b.StopTimer()
			kids, err := s.Fork(ctx, root, 1)
			if err != nil {
				b.Fatal(err)
			}
			writeChange(b, upperOf(b, kids[0].Mounts), 1<<10)
			b.StartTimer()
			if _, err := s.Abort(ctx, branch.Ref{Root: root.Root, Branch: kids[0].ID}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=overlayfs", func(b *testing.B) {
		sn, base := overlayBase(b, ctx, 10000)
		i := 0
		for b.Loop() {
			b.StopTimer()
			key := fmt.Sprintf("c%d", i)
			i++
			m, err := sn.Prepare(ctx, key, base)
			if err != nil {
				b.Fatal(err)
			}
			writeChange(b, upperOf(b, m), 1<<10)
			b.StartTimer()
			if err := sn.Remove(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func upperOf(b testing.TB, m []mount.Mount) string {
	b.Helper()
	for _, o := range m[0].Options {
		if u, ok := strings.CutPrefix(o, "upperdir="); ok {
			return u
		}
	}
	b.Fatalf("no upperdir in %v", m)
	return ""
}

// BenchmarkForkLookedUp: fork of one child of a mounted 10,000-file
// sandbox right after every file was looked up through its mount (what a
// build or git status leaves in the dentry cache), then its abort, each
// timed (ns/fork, ns/abort); the lookups are not. impl=superblock seals
// the parent's superblock every time (the default); impl=adaptive has
// sealChoice's threshold set (--seal-mounts-after=2ms); op=at-rest forks
// without the lookups.
func BenchmarkForkLookedUp(b *testing.B) {
	ctx := context.Background()
	for _, op := range []string{"looked-up", "at-rest"} {
		b.Run("op="+op, func(b *testing.B) {
			for _, impl := range []string{"adaptive", "superblock"} {
				b.Run("impl="+impl, func(b *testing.B) {
					v := benchFixtures.get(b, "lookup-"+op+"-"+impl, func(dir string, add func(func())) (any, error) {
						s, target, err := mountedSandbox(b, ctx, dir, 10000, add)
						return [2]any{s, target}, err
					}).([2]any)
					s, target := v[0].(*Snapshotter), v[1].(string)
					if impl == "adaptive" {
						s.choice.threshold = SlowSuperblockSeal
					}
					root := branch.Ref{Root: branch.Root{Key: "sandbox"}}
					var forks, aborts time.Duration
					for b.Loop() {
						b.StopTimer()
						if op == "looked-up" {
							lookUpAll(b, target)
						}
						start := time.Now()
						kids, err := s.Fork(ctx, root, 1)
						if err != nil {
							b.Fatal(err)
						}
						forks += time.Since(start)
						start = time.Now()
						if _, err := s.Abort(ctx, branch.Ref{Root: root.Root, Branch: kids[0].ID}); err != nil {
							b.Fatal(err)
						}
						aborts += time.Since(start)
						b.StartTimer()
					}
					b.ReportMetric(float64(forks.Nanoseconds())/float64(b.N), "ns/fork")
					b.ReportMetric(float64(aborts.Nanoseconds())/float64(b.N), "ns/abort")
				})
			}
		})
	}
}

// lookUpAll stats every file under dir.
func lookUpAll(b *testing.B, dir string) {
	b.Helper()
	if err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		_, err = d.Info()
		return err
	}); err != nil {
		b.Fatal(err)
	}
}
