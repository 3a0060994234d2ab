//go:build linux

package snapshotter

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/branchbox/branchbox/snapshotter/layer"
)

func TestManifestCache(t *testing.T) {
	dir := t.TempDir()
	save := func(name string, entries int) (string, layer.Manifest) {
		t.Helper()
		m := layer.Manifest{}
		for i := range entries {
			m[fmt.Sprintf("f%d", i)] = layer.Entry{Ino: uint64(i + 1)}
		}
		path := filepath.Join(dir, name)
		if err := layer.SaveManifest(path, m); err != nil {
			t.Fatal(err)
		}
		return path, m
	}
	var c manifestCache
	a, _ := save("a", 3)
	m1, err := c.load(a)
	if err != nil || len(m1) != 3 {
		t.Fatalf("load: %d entries, %v", len(m1), err)
	}
	m1["marker"] = layer.Entry{}
	if m2, _ := c.load(a); len(m2) != 4 {
		t.Fatalf("second load of an unchanged file read it again (%d entries), want the cached manifest", len(m2))
	}
	// The same path written again (a checkpoint number used again after
	// a failed attempt) is read again.
	save("a", 5)
	if m3, _ := c.load(a); len(m3) != 5 {
		t.Fatalf("load of a rewritten file gave %d entries, want its 5", len(m3))
	}
	// Bounded: the least recently used go first.
	for i := range manifestCacheSize + 2 {
		p, _ := save(fmt.Sprintf("n%d", i), 1)
		if _, err := c.load(p); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.entries) != manifestCacheSize {
		t.Fatalf("%d manifests cached, want at most %d", len(c.entries), manifestCacheSize)
	}
	for _, e := range c.entries {
		if e.path == a {
			t.Fatal("the least recently used manifest is still cached")
		}
	}
	big, _ := save("big", manifestCacheEntries+1)
	if _, err := c.load(big); err != nil {
		t.Fatal(err)
	}
	if c.entries[0].path == big {
		t.Fatalf("a manifest of more than %d entries was cached", manifestCacheEntries)
	}
	if _, err := c.load(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("load of a missing manifest succeeded")
	}
}
