//go:build linux

package layer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// makeUpper fills dir with dirs directories of files files each ("" for
// files directly in dir when dirs is 0).
func makeUpper(tb testing.TB, dir string, dirs, files int) {
	tb.Helper()
	for d := range max(dirs, 1) {
		sub := dir
		if dirs > 0 {
			sub = filepath.Join(dir, fmt.Sprintf("d%03d", d))
			if err := os.Mkdir(sub, 0o755); err != nil {
				tb.Fatal(err)
			}
		}
		for f := range files {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%05d", f)), nil, 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// BenchmarkDiff: what a checkpoint or a rollback pays to find a 1-file
// change in an upper of 10,000 files, in one directory (a sandbox that
// wrote them, as BenchmarkTail's) and in 100 directories.
func BenchmarkDiff(b *testing.B) {
	ctx := context.Background()
	for _, shape := range []struct {
		name        string
		dirs, files int
	}{{"flat", 0, 10000}, {"dirs=100", 100, 100}} {
		b.Run("files=10000/"+shape.name, func(b *testing.B) {
			upper := b.TempDir()
			makeUpper(b, upper, shape.dirs, shape.files)
			// Past the margin within which a ctime counts as changed.
			time.Sleep(2 * recentMargin())
			_, m, err := Diff(ctx, upper, Manifest{})
			if err != nil {
				b.Fatal(err)
			}
			changed := filepath.Join(upper, "changed")
			for b.Loop() {
				b.StopTimer()
				if err := os.WriteFile(changed, []byte("x"), 0o644); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				changes, _, err := Diff(ctx, upper, m)
				if err != nil {
					b.Fatal(err)
				}
				if len(changes) != 1 || changes[0].Path != "changed" {
					b.Fatalf("changes %v, want the one file written", changes)
				}
			}
		})
	}
}

// BenchmarkLoadManifest: reading back the manifest of an upper of 10,000
// files, as every rollback does.
func BenchmarkLoadManifest(b *testing.B) {
	upper := b.TempDir()
	makeUpper(b, upper, 0, 10000)
	_, m, err := Diff(context.Background(), upper, Manifest{})
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "manifest")
	if err := SaveManifest(path, m); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		got, err := LoadManifest(path)
		if err != nil || len(got) != len(m) {
			b.Fatalf("loaded %d entries (%v), want %d", len(got), err, len(m))
		}
	}
}
