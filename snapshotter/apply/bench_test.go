//go:build linux

package apply

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

const benchBaseFiles = 10000

// benchBase writes a 10,000-file base in 100 directories.
func benchBase(b *testing.B, l string) {
	for i := range benchBaseFiles {
		write(b, filepath.Join(l, fmt.Sprintf("d%02d/f%04d", i%100, i)), "base file content", 0o644)
	}
}

// benchUpper makes a kernel-written upper whose change set totals size
// bytes: half new files, half rewrites of base files, in files of at most
// 1 MB.
func benchUpper(b *testing.B, dir, l string, size int) string {
	u := filepath.Join(dir, "U")
	unmount := mountOverlay(b, filepath.Join(dir, "M"), u, filepath.Join(dir, "W"), l)
	defer unmount()
	per := min(size, 1<<20)
	if size >= 100<<10 && size < 1<<20 {
		per = size / 10
	}
	r := rand.New(rand.NewPCG(uint64(size), 1))
	buf := make([]byte, per)
	for i := 0; i*per < size; i++ {
		for j := range buf {
			buf[j] = byte(r.Uint32())
		}
		name := fmt.Sprintf("new/n%d", i)
		if i%2 == 1 {
			name = fmt.Sprintf("d%02d/f%04d", i%100, i)
		}
		p := filepath.Join(dir, "M", name)
		must(b, os.MkdirAll(filepath.Dir(p), 0o755))
		must(b, os.WriteFile(p, buf, 0o644))
	}
	return u
}

// BenchmarkApply times committing a change set of each size onto a fresh
// overlay mount of a 10,000-file base, through the mount. impl=branch is
// Apply; impl=cp-a is `cp -a upper/. target/` into the same kind of fresh
// mount, the obvious way to copy an upper's content (it copies data,
// modes, owners, times and xattrs but cannot handle whiteouts or opaque
// directories, which this change set has none of). Mounting the target and
// removing it afterwards are not timed.
func BenchmarkApply(b *testing.B) {
	requireRoot(b)
	root := b.TempDir()
	l := filepath.Join(root, "L")
	benchBase(b, l)
	for _, sz := range []struct {
		name string
		n    int
	}{{"1KB", 1 << 10}, {"100KB", 100 << 10}, {"1MB", 1 << 20}, {"100MB", 100 << 20}} {
		dir := filepath.Join(root, sz.name)
		must(b, os.Mkdir(dir, 0o755))
		u := benchUpper(b, dir, l, sz.n)
		for _, impl := range []string{"branch", "cp-a"} {
			b.Run("size="+sz.name+"/impl="+impl, func(b *testing.B) {
				ctx := context.Background()
				i := 0
				b.SetBytes(int64(sz.n))
				b.StopTimer()
				for range b.N {
					run := filepath.Join(dir, fmt.Sprintf("%s-%d", impl, i))
					i++
					tgt := filepath.Join(run, "T")
					unmount := mountOverlay(b, tgt, filepath.Join(run, "U"), filepath.Join(run, "W"), l)
					b.StartTimer()
					if impl == "branch" {
						if _, err := Apply(ctx, u, tgt); err != nil {
							b.Fatal(err)
						}
					} else {
						if out, err := exec.Command("cp", "-a", u+"/.", tgt+"/").CombinedOutput(); err != nil {
							b.Fatalf("cp -a: %v: %s", err, out)
						}
					}
					b.StopTimer()
					unmount()
					must(b, os.RemoveAll(run))
				}
			})
		}
	}
}
