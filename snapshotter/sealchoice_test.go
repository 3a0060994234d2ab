//go:build linux

package snapshotter

import (
	"fmt"
	"testing"
	"time"
)

// TestSealChoice: a superblock seal above the threshold sends its parent
// to the per-mount seal, which it keeps while that is cheaper than the
// slow seal decayed by a quarter a fork; others stay on the superblock.
func TestSealChoice(t *testing.T) {
	var off sealChoice
	off.superblockTook("/a", time.Second)
	if off.eachMount("/a") {
		t.Fatal("with no threshold set a slow seal made its parent seal mount by mount")
	}
	c := sealChoice{threshold: SlowSuperblockSeal}
	c.superblockTook("/a", SlowSuperblockSeal)
	if c.eachMount("/a") {
		t.Fatal("a seal at the threshold made its parent seal mount by mount")
	}
	c.superblockTook("/a", 20*time.Millisecond)
	if !c.eachMount("/a") || c.eachMount("/b") {
		t.Fatalf("after a 20 ms seal of /a: eachMount(/a)=%v, eachMount(/b)=%v; want true, false", c.eachMount("/a"), c.eachMount("/b"))
	}
	// 20 ms decays below 1 ms in 11 forks: 20 * 0.75^11 = 0.84.
	forks := 0
	for c.eachMount("/a") {
		c.eachMountTook("/a", time.Millisecond)
		if forks++; forks > 100 {
			t.Fatal("the per-mount seal was kept for good")
		}
	}
	if forks != 11 {
		t.Fatalf("back to the superblock after %d per-mount seals, want 11", forks)
	}
	// A fast superblock seal leaves the choice as it is; a slow one
	// again comes first.
	c.superblockTook("/a", time.Microsecond)
	if c.eachMount("/a") {
		t.Fatal("a fast superblock seal made its parent seal mount by mount")
	}
	c.superblockTook("/a", 5*time.Millisecond)
	c.forget("/a")
	if c.eachMount("/a") {
		t.Fatal("forget kept the per-mount seal")
	}
	// Bounded: the oldest are dropped.
	for i := 0; i < sealChoiceSize+10; i++ {
		c.superblockTook(fmt.Sprintf("/p%d", i), 5*time.Millisecond)
	}
	if len(c.slow) != sealChoiceSize || c.eachMount("/p0") || !c.eachMount(fmt.Sprintf("/p%d", sealChoiceSize+9)) {
		t.Fatalf("%d parents remembered (want %d); the oldest kept: %v", len(c.slow), sealChoiceSize, c.eachMount("/p0"))
	}
	// WithSlowSeal sets the threshold.
	var cfg config
	WithSlowSeal(time.Millisecond)(&cfg)
	on := sealChoice{threshold: cfg.slowSeal}
	on.superblockTook("/a", 2*time.Millisecond)
	if !on.eachMount("/a") {
		t.Fatal("WithSlowSeal(1ms): a 2 ms seal did not make its parent seal mount by mount")
	}
}
