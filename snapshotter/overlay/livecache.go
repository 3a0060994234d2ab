//go:build linux

package overlay

import (
	"sync"

	"golang.org/x/sys/unix"
)

// LiveCache remembers where each upper is mounted, so that finding a
// writable branch's live mount (once per fork) costs a statx and a statfs
// instead of reading and parsing the whole mount table. An entry is trusted
// only while the mount at its target still has the same unique mount id
// (never reused, unlike mountinfo's ids), so an unmount, or a mount on top,
// sends the lookup back to the mount table. So does a read-only answer from
// statfs: it cannot tell a read-only superblock (a seal) from a read-only
// mount of a writable one, which must still be sealed.
type LiveCache struct {
	mu      sync.Mutex
	byUpper map[string]cachedLive
}

type cachedLive struct {
	target  string
	options string
	mntID   uint64 // STATX_MNT_ID_UNIQUE of the mount at target
}

// maxCachedLive bounds the cache; past it, it starts again empty.
const maxCachedLive = 4096

// Find is liveMount(upper), from the cache when it can be.
func (c *LiveCache) Find(upper string) (Live, error) {
	c.mu.Lock()
	e, ok := c.byUpper[upper]
	c.mu.Unlock()
	if ok {
		live, state := e.check()
		switch state {
		case cacheWritable:
			return live, nil
		case cacheStale:
			c.forget(upper)
		}
	}
	t, err := ReadTable()
	if err != nil {
		return Live{}, err
	}
	for _, m := range t {
		if !UpperIs(m, upper) {
			continue
		}
		live := Live{Target: m.Mountpoint, Readonly: hasMountOpt(m.VFSOptions, "ro"), Options: m.Options}
		if !live.Readonly && hasMountOpt(m.Options, "rw") {
			if old, unique, err := mountIDs(m.Mountpoint); err == nil && old == uint64(m.ID) {
				c.remember(upper, cachedLive{target: m.Mountpoint, options: m.Options, mntID: unique})
			}
		}
		return live, nil
	}
	return Live{}, nil
}

type cacheState int

const (
	cacheWritable cacheState = iota // the mount and its superblock are writable
	cacheReadonly                   // read-only somehow: ask the mount table
	cacheStale                      // no longer the mount at target
)

// check says whether the entry still names the mount at its target, and
// whether that mount is writable.
func (e cachedLive) check() (Live, cacheState) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, e.target, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return Live{}, cacheStale
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 || stx.Mnt_id != e.mntID {
		return Live{}, cacheStale
	}
	var st unix.Statfs_t
	if err := unix.Statfs(e.target, &st); err != nil {
		return Live{}, cacheStale
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		return Live{}, cacheReadonly
	}
	return Live{Target: e.target, Options: e.options}, cacheWritable
}

func (c *LiveCache) remember(upper string, e cachedLive) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byUpper == nil || len(c.byUpper) >= maxCachedLive {
		c.byUpper = map[string]cachedLive{}
	}
	c.byUpper[upper] = e
}

func (c *LiveCache) forget(upper string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byUpper, upper)
}

// mountIDs returns the mount id (as mountinfo shows it) and the unique
// mount id of the mount at path; the unique id needs Linux 6.8.
func mountIDs(path string) (old, unique uint64, err error) {
	var stx unix.Statx_t
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	if err := unix.Statx(unix.AT_FDCWD, path, flags, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, 0, err
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, 0, unix.ENOTSUP
	}
	old = stx.Mnt_id
	if err := unix.Statx(unix.AT_FDCWD, path, flags, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return 0, 0, err
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return 0, 0, unix.ENOTSUP
	}
	return old, stx.Mnt_id, nil
}
