//go:build linux

package snapshotter

import (
	"sync"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/snapshotter/layer"
)

// The cache's bounds: an agent rolls back to the same few checkpoints again
// and again; a decoded entry costs about 100 bytes of the snapshotter's
// memory.
const (
	manifestCacheSize    = 4
	manifestCacheEntries = 200_000
)

// manifestCache keeps the manifests of the checkpoints used last, decoded:
// a rollback reads its checkpoint's, and a checkpoint its parent's (3-4 ms
// of gob for an upper of 10,000 files). A checkpoint's manifest is never
// rewritten in place, but its number can be used again after a failed
// attempt, so an entry holds only while the file is the same inode with
// the same change time and size. The manifests handed out are shared: no
// caller may change one (layer.Diff only reads its argument).
type manifestCache struct {
	mu      sync.Mutex
	entries []cachedManifest // most recently used first
}

type cachedManifest struct {
	path  string
	ino   uint64
	ctime unix.Timespec
	size  int64
	m     layer.Manifest
}

// load returns the manifest at path, from the cache if the file is the
// one cached. A manifest read is cached under the file's identity taken
// before the read: a file replaced meanwhile is read again next time,
// never served as the one replaced.
func (c *manifestCache) load(path string) (layer.Manifest, error) {
	var st unix.Stat_t
	statErr := unix.Stat(path, &st)
	if statErr == nil {
		if m, ok := c.hit(path, &st); ok {
			return m, nil
		}
	}
	m, err := layer.LoadManifest(path)
	if err != nil {
		return nil, err
	}
	if statErr == nil {
		c.insert(path, &st, m)
	}
	return m, nil
}

// put caches m as the manifest at path, as the file is now.
func (c *manifestCache) put(path string, m layer.Manifest) {
	var st unix.Stat_t
	if unix.Stat(path, &st) == nil {
		c.insert(path, &st, m)
	}
}

// hit returns the manifest cached for path if st is the file cached, and
// makes it the most recently used.
func (c *manifestCache) hit(path string, st *unix.Stat_t) (layer.Manifest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.entries {
		if e.path == path && e.ino == st.Ino && e.ctime == st.Ctim && e.size == st.Size {
			copy(c.entries[1:i+1], c.entries[:i])
			c.entries[0] = e
			return e.m, true
		}
	}
	return nil, false
}

// insert caches m as the manifest of the file at path that st describes,
// first, dropping the least recently used beyond the bounds.
func (c *manifestCache) insert(path string, st *unix.Stat_t, m layer.Manifest) {
	if len(m) > manifestCacheEntries {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	entries := []cachedManifest{{path: path, ino: st.Ino, ctime: st.Ctim, size: st.Size, m: m}}
	total := len(m)
	for _, e := range c.entries {
		if e.path == path {
			continue
		}
		if total += len(e.m); len(entries) == manifestCacheSize || total > manifestCacheEntries {
			break
		}
		entries = append(entries, e)
	}
	c.entries = entries
}
