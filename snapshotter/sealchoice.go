package snapshotter

import (
	"sync"
	"time"
)

// How a fork seals its parent when either way would do: the superblock's
// read-only remount (reaching every mount of the overlay, even one no
// process can name) or each mount on its own (sealEachMount).
//
// The superblock's remount first frees every unused dentry of the overlay
// (the kernel's reconfigure_super calls shrink_dcache_sb, on any remount),
// about 1.4 us a dentry here: a fork right after the sandbox looked up
// its 10,000 files waits 15-20 ms for it, against 40 us at rest, and the
// unseal's remount pays it again for what was looked up while sealed. The
// per-mount seal touches no dentry but costs a scan of every mount
// namespace and a transaction (about 1 ms here). So, with a threshold set
// (WithSlowSeal; off by default), a parent whose last superblock seal was
// slow, a sandbox that looks up many files between forks (a build, a test
// run, git status), is sealed mount by mount from then on, while that
// stays the cheaper; docs/seal.md says what the per-mount seal does not
// reach, and docs/benchmarks.md what it costs where (an abort right after
// a fork that followed writes: 3 -> 10 ms, not understood yet).

// SlowSuperblockSeal is the threshold docs/seal.md suggests: a superblock
// seal that takes longer frees about 1,400 dentries, about the per-mount
// seal's own cost.
const SlowSuperblockSeal = 2 * time.Millisecond

// sealChoiceSize bounds the parents remembered: the sandboxes that fork
// most, each an upper path and a duration.
const sealChoiceSize = 256

// sealChoice remembers the parents whose superblock seal was slow, by
// upper directory, most recently used first. It is only memory: a
// restarted snapshotter seals each parent's superblock again first.
type sealChoice struct {
	mu   sync.Mutex
	slow []slowSeal
	// threshold is WithSlowSeal's; 0, no seal is slow.
	threshold time.Duration
}

type slowSeal struct {
	upper string
	// took is the superblock seal that was slow; the per-mount seal is
	// kept while it costs less than that.
	took time.Duration
}

// eachMount says whether the parent whose upper is upper should be
// sealed mount by mount.
func (c *sealChoice) eachMount(upper string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.find(upper) >= 0
}

// superblockTook records a superblock seal of upper's parent that took d.
func (c *sealChoice) superblockTook(upper string, d time.Duration) {
	if c.threshold <= 0 || d <= c.threshold {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remove(c.find(upper))
	c.slow = append([]slowSeal{{upper: upper, took: d}}, c.slow...)
	if len(c.slow) > sealChoiceSize {
		c.slow = c.slow[:sealChoiceSize]
	}
}

// eachMountTook records a per-mount seal of upper's parent that took d.
// The superblock seal's cost remembered decays by a quarter at each: once
// it is below the per-mount seal's own (a node with many processes makes
// the scan of their mount namespaces long), the parent goes back to the
// superblock's, which measures it again (after about 11 forks from a 20
// ms seal, 3 from a 2 ms one: one slow seal in so many, if the parent
// still looks up as much).
func (c *sealChoice) eachMountTook(upper string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.find(upper)
	if i < 0 {
		return
	}
	e := c.slow[i]
	c.remove(i)
	if e.took = e.took * 3 / 4; d < e.took {
		c.slow = append([]slowSeal{e}, c.slow...)
	}
}

// forget sends upper's parent back to the superblock seal.
func (c *sealChoice) forget(upper string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remove(c.find(upper))
}

func (c *sealChoice) find(upper string) int {
	for i, e := range c.slow {
		if e.upper == upper {
			return i
		}
	}
	return -1
}

func (c *sealChoice) remove(i int) {
	if i >= 0 {
		c.slow = append(c.slow[:i], c.slow[i+1:]...)
	}
}
