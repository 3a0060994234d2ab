//go:build linux

package initdriver

import (
	"context"
	"fmt"
	"path"

	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/containerd/log"
)

// The pool after a fork: the inits taken ahead that no branch claimed are
// discarded, and the pool is filled again for the next fork, in the
// background.

// Release discards an init taken ahead that no branch claimed.
func (a *Ahead) Release(ctx context.Context) {
	if a.claimed {
		return
	}
	a.claimed = true
	<-a.renamed
	a.s.Discard(ctx)
}

// roomFor says whether one more init may be started ahead under the
// process limits above the sandbox: it is counted there like any process
// of the sandbox, so the pool grows only while at least half of each limit
// stays free for the sandbox's own processes and its forks.
func (p *Pool) roomFor() bool {
	ms, err := p.d.Cgroups.Mounts()
	if err != nil {
		return false
	}
	for _, l := range cgroup.PidsLimits(ms, p.parent) {
		if l.Room()-1 < l.Max/2 {
			return false
		}
	}
	return true
}

// Fill asks for at least n inits and starts what is missing in the
// background.
func (p *Pool) Fill(ctx context.Context, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > maxWarm {
		n = maxWarm
	}
	if n > p.want {
		p.want = n
	}
	if p.filling || p.closed || len(p.ready) >= p.want {
		return
	}
	p.filling = true
	p.filler.Add(1)
	go p.run(context.WithoutCancel(ctx))
}

func (p *Pool) run(ctx context.Context) {
	defer p.filler.Done()
	for {
		p.mu.Lock()
		if p.closed || len(p.ready) >= p.want || !p.roomFor() {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.next++
		cg := path.Join(p.parent, fmt.Sprintf("%s%d", poolPrefix, p.next))
		p.mu.Unlock()
		s, err := p.d.Spawn(ctx, cg, p.flags)
		if err == nil && p.prep != nil {
			if perr := s.prep(p.prep); perr != nil {
				// Inits from now on build all of their roots at the fork.
				log.G(ctx).WithError(perr).Warn("an init started ahead could not build the early part of a branch's root; the pool's inits no longer do")
				s.Discard(ctx)
				p.mu.Lock()
				p.prep = nil
				p.mu.Unlock()
				continue
			}
		}
		p.mu.Lock()
		if err != nil || p.closed {
			p.filling = false
			p.mu.Unlock()
			if err != nil {
				log.G(ctx).WithError(err).Warn("start a branch init ahead of a fork")
			} else {
				s.Discard(ctx)
			}
			return
		}
		p.ready = append(p.ready, s)
		p.mu.Unlock()
	}
}
