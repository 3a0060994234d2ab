//go:build linux

package initdriver

import (
	"context"
	"sync"
)

// maxWarm bounds the inits kept started for one sandbox.
const maxWarm = 16

// poolPrefix names the cgroups of inits started ahead of a fork; a branch
// that takes one renames it to its own name.
const poolPrefix = "bbx-pool-"

// Pool keeps branch inits started ahead of the forks of a sandbox's
// root: in the namespaces a branch of it gets and in a cgroup under the
// sandbox's, waiting for their instructions. A fork takes them, so that a
// branch starts with only its root to build: making its cgroup on every
// hierarchy and starting a process in new namespaces inside it are done
// between forks. Each waiting init is one small process in the sandbox's
// cgroup (counted by its pids limit), and the pool holds as many as the
// largest fork asked for, up to maxWarm, and only while half of any
// process limit above the sandbox stays free (roomFor).
type Pool struct {
	d      *Driver
	parent string  // the sandbox's cgroup
	flags  uintptr // the namespaces its inits are cloned with
	// prep is the early part of a branch's plan (splitPrep) that each
	// init runs once started, or nil.
	prep []byte

	mu      sync.Mutex
	ready   []*Spawned
	want    int
	next    int
	filling bool
	closed  bool
	filler  sync.WaitGroup
}

func NewPool(d *Driver, parentCgroup string, flags uintptr, prep []byte) *Pool {
	return &Pool{d: d, parent: parentCgroup, flags: flags, prep: prep}
}

// takeReady takes a started init cloned with flags out of the pool, or
// returns nil.
func (p *Pool) takeReady(ctx context.Context, flags uintptr) *Spawned {
	p.mu.Lock()
	if p.closed || flags != p.flags || len(p.ready) == 0 {
		p.mu.Unlock()
		return nil
	}
	s := p.ready[0]
	p.ready = p.ready[1:]
	p.mu.Unlock()
	// A rename waits for the move into the cgroup, which writes to the
	// cgroup's files by their path; an init that died while it waited
	// (the sandbox's OOM killer, say) is no use.
	if err := s.waitJoined(); err != nil || s.ended() {
		s.Discard(ctx)
		return nil
	}
	return s
}

// Ahead is an init taken from the pool before the snapshotter named its
// branch: its cgroup is renamed, meanwhile, to the name the branch id the
// sandbox gives next would have (guess). The rename, a third of a start
// on a v1 host, then overlaps the snapshotter's work.
type Ahead struct {
	s       *Spawned
	Guess   string
	renamed chan error
	claimed bool
}

// TakeAhead takes an init for a branch whose cgroup will likely be guess
// and starts renaming its cgroup to it; nil if the pool has none.
func (p *Pool) TakeAhead(ctx context.Context, guess string) *Ahead {
	s := p.takeReady(ctx, p.flags)
	if s == nil {
		return nil
	}
	a := &Ahead{s: s, Guess: guess, renamed: make(chan error, 1)}
	go func() { a.renamed <- s.rename(guess) }()
	return a
}

// Count is how many started inits the pool holds.
func (p *Pool) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// Close ends the pool and every init waiting in it.
func (p *Pool) Close(ctx context.Context) {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.filler.Wait() // what it starts now, it discards
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, s := range ready {
		s.Discard(ctx)
	}
}
