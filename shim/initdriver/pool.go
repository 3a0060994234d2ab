//go:build linux

package initdriver

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/containerd/log"
)

// maxWarm bounds the inits kept started for one sandbox.
const maxWarm = 16

// poolPrefix names the cgroups of inits started ahead of a fork whose
// branch's name is not known (Fill's names); a branch that takes one
// renames it to its own name.
const poolPrefix = "bbx-pool-"

// Naming an init's cgroup ahead: a cgroup2 directory cannot be renamed
// (nor the unified hierarchy's of a hybrid host), so a branch that takes
// an init from the pool moves it into a new cgroup there, and the first
// cgroup move after a quiet moment waits for an RCU grace period (the
// kernel's cgroup_threadgroup_rwsem, taken for writing; 4.6-8 ms here,
// unless the hierarchy is mounted favordynmods). So the pool starts each
// init in the cgroup the branch that will likely take it gets, named from
// the ids the sandbox gives next, and a fork that takes it moves or
// renames nothing. A name is made exclusively; a branch started without
// the pool's init of its name (another flag, the runtime) has it discarded
// first (takeNamed, Evict), and the pool never names an init after a
// cgroup a branch start asked for meanwhile (reserved). An init taken for
// another name (Take) keeps its cgroup until it is moved away, so a
// branch start that wants that name waits until then (leaving): else it
// would make its cgroup in the directory being renamed away under it.

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
	// names is the cgroup of the branch likely to take the k-th init of
	// ready, "" if not known (Fill's).
	names func(k int) string
	// inflight is the cgroup of the init being started, if named so;
	// spawned is signalled when it is in ready (or failed).
	inflight string
	spawned  *sync.Cond
	// reserved are cgroups branch starts asked for and did not find here:
	// the pool names no init after one of them.
	reserved map[string]bool
	// leaving are the cgroups of inits taken for another name and not yet
	// moved away or removed.
	leaving map[string]bool
	// busy counts the sandbox's operations running, lastActive is when
	// the last ended, and wake tells a refill waiting for quiet
	// (active.go, refill.go).
	busy       int
	lastActive time.Time
	wake       chan struct{}
}

func NewPool(d *Driver, parentCgroup string, flags uintptr, prep []byte) *Pool {
	p := &Pool{d: d, parent: parentCgroup, flags: flags, prep: prep, wake: make(chan struct{}, 1)}
	p.spawned = sync.NewCond(&p.mu)
	return p
}

// takeNamed takes the init named cgroup out of the pool, waiting for it if
// it is being started; if there is none, the pool will not name one so.
func (p *Pool) takeNamed(ctx context.Context, cgroup string) *Spawned {
	p.mu.Lock()
	for cgroup != "" && (p.inflight == cgroup || p.leaving[cgroup]) {
		p.spawned.Wait()
	}
	i := slices.IndexFunc(p.ready, func(s *Spawned) bool { return s.cgroup == cgroup })
	if i < 0 {
		if p.reserved == nil {
			p.reserved = map[string]bool{}
		}
		p.reserved[cgroup] = true
		p.mu.Unlock()
		return nil
	}
	s := p.ready[i]
	p.ready = slices.Delete(p.ready, i, i+1)
	p.mu.Unlock()
	if err := s.waitJoined(); err != nil || s.ended() {
		s.Discard(ctx)
		return nil
	}
	return s
}

// Evict discards the init named cgroup, if the pool holds one, before a
// branch of that name starts without it (on the runtime).
func (p *Pool) Evict(ctx context.Context, cgroup string) {
	if s := p.takeNamed(ctx, cgroup); s != nil {
		s.Discard(ctx)
	}
}

// takeOut takes the first started init cloned with flags out of the pool,
// or returns nil; its cgroup's name is leaving until moveAway.
func (p *Pool) takeOut(flags uintptr) *Spawned {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || flags != p.flags || len(p.ready) == 0 {
		return nil
	}
	s := p.ready[0]
	p.ready = p.ready[1:]
	if p.leaving == nil {
		p.leaving = map[string]bool{}
	}
	p.leaving[s.cgroup] = true
	return s
}

// moveAway renames the cgroup of an init taken out to cgroup, or discards
// the init (nil).
func (p *Pool) moveAway(ctx context.Context, s *Spawned, cgroup string) *Spawned {
	defer p.left(s.cgroup)
	// A rename waits for the move into the cgroup, which writes to the
	// cgroup's files by their path; an init that died while it waited
	// (the sandbox's OOM killer, say) is no use.
	if err := s.waitJoined(); err != nil || s.ended() {
		s.Discard(ctx)
		return nil
	}
	return s.renamedOrDiscarded(ctx, cgroup)
}

// renamedOrDiscarded renames a pre-started init's cgroup to cgroup and
// returns it, or discards it, with what is left under either name, if the
// rename fails (nil: the branch starts an init of its own).
func (s *Spawned) renamedOrDiscarded(ctx context.Context, cgroup string) *Spawned {
	if err := s.rename(cgroup); err != nil {
		log.G(ctx).WithError(err).WithField("cgroup", cgroup).Warn("use a pre-started branch init; starting one instead")
		s.Discard(ctx)
		return nil
	}
	return s
}

// left ends the move of an init's cgroup away from the name from.
func (p *Pool) left(from string) {
	p.mu.Lock()
	delete(p.leaving, from)
	p.spawned.Broadcast()
	p.mu.Unlock()
}

// Ahead is an init taken from the pool before the snapshotter named its
// branch: its cgroup is renamed, meanwhile, to the name the branch id the
// sandbox gives next would have (guess). The rename, a third of a start
// on a v1 host, then overlaps the snapshotter's work.
type Ahead struct {
	Guess string
	// renamed gives the init once renamed, nil if it could not be
	// (discarded).
	renamed chan *Spawned
	claimed bool
}

// TakeAhead takes an init for a branch whose cgroup will likely be guess
// and starts renaming its cgroup to it; nil if the pool has none.
func (p *Pool) TakeAhead(ctx context.Context, guess string) *Ahead {
	if s := p.takeNamed(ctx, guess); s != nil {
		a := &Ahead{Guess: guess, renamed: make(chan *Spawned, 1)}
		a.renamed <- s
		return a
	}
	s := p.takeOut(p.flags)
	if s == nil {
		return nil
	}
	a := &Ahead{Guess: guess, renamed: make(chan *Spawned, 1)}
	go func() { a.renamed <- p.moveAway(ctx, s, guess) }()
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
	p.wakeUp()
	p.filler.Wait() // what it starts now, it discards
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, s := range ready {
		s.Discard(ctx)
	}
}
