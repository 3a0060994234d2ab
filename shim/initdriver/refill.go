//go:build linux

package initdriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/branchbox/branchbox/shim/cgroup"
	"github.com/containerd/log"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// The pool after a fork: the inits taken ahead that no branch claimed are
// discarded, and the pool is filled again for the next fork, in the
// background, each new init doing the early part of a branch's plan
// (brinit.SplitPrep) at once.

// The refill out of the sandbox's way. Starting an init moves it into the
// cgroup v1 hierarchies it was not born in, and each move holds the
// kernel's global cgroup_mutex while the move waits for an RCU grace
// period (unless the hierarchies are mounted favordynmods): every cgroup
// made or removed on the node meanwhile, a fork's or an abort's, waits
// behind it. So the refill starts each init once the sandbox has had no
// operation for quietGap, or after quietMax at the latest, so that a
// sandbox that never pauses still gets its inits.
const (
	quietGap = 20 * time.Millisecond
	quietMax = 100 * time.Millisecond
)

// waitQuiet waits until no operation of the sandbox has run for quietGap,
// quietMax at most, or the pool is closed; the caller holds p.mu.
func (p *Pool) waitQuiet() {
	deadline := time.Now().Add(quietMax)
	for !p.closed {
		now := time.Now()
		wait := deadline.Sub(now)
		if wait <= 0 {
			return
		}
		if p.busy == 0 {
			q := p.lastActive.Add(quietGap).Sub(now)
			if q <= 0 {
				return
			}
			wait = min(wait, q)
		}
		p.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.wake:
		}
		t.Stop()
		p.mu.Lock()
	}
}

// Release discards an init taken ahead that no branch claimed.
func (a *Ahead) Release(ctx context.Context) {
	if a.claimed {
		return
	}
	a.claimed = true
	if s := <-a.renamed; s != nil {
		s.Discard(ctx)
	}
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
// background; names(k), if not nil, is the cgroup of the branch likely to
// take the k-th init of the pool (the sandbox's next ids), each new init
// started in it.
func (p *Pool) Fill(ctx context.Context, n int, names func(k int) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The names reserved were branches' before these: none is named again.
	p.names, p.reserved = names, nil
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
		if !p.closed && len(p.ready) < p.want {
			p.waitQuiet()
		}
		if p.closed || len(p.ready) >= p.want || !p.roomFor() {
			p.filling = false
			p.mu.Unlock()
			return
		}
		cg := ""
		if p.names != nil {
			cg = p.names(len(p.ready))
		}
		named := cg != "" && !p.reserved[cg]
		if named {
			p.inflight = cg
		} else {
			cg = p.poolName()
		}
		p.mu.Unlock()
		s, err := p.spawnOne(ctx, cg, named)
		if err == nil && p.prep != nil {
			if perr := s.prep(p.prep, p.d.SharedRoot); perr != nil {
				// Inits from now on build all of their roots at the fork.
				log.G(ctx).WithError(perr).Warn("an init started ahead could not build the early part of a branch's root; the pool's inits no longer do")
				s.Discard(ctx)
				p.mu.Lock()
				p.prep = nil
				p.startedOne()
				p.mu.Unlock()
				continue
			}
		}
		p.mu.Lock()
		if err != nil || p.closed {
			p.filling = false
			p.startedOne()
			p.mu.Unlock()
			if err != nil {
				log.G(ctx).WithError(err).Warn("start a branch init ahead of a fork")
			} else {
				s.Discard(ctx)
			}
			return
		}
		p.ready = append(p.ready, s)
		p.startedOne()
		p.mu.Unlock()
	}
}

// spawnOne starts an init in cgroup cg, the pool's inflight one if it was
// named for a branch: exclusively, and under a name of the pool's if a
// branch has it already (the ids guessed were used behind the shim's
// back).
func (p *Pool) spawnOne(ctx context.Context, cg string, named bool) (*Spawned, error) {
	if !named {
		return p.d.Spawn(ctx, cg, p.flags)
	}
	s, err := p.d.spawn(ctx, cg, p.flags, true)
	if !errors.Is(err, errCgroupExists) {
		return s, err
	}
	p.mu.Lock()
	cg = p.poolName()
	p.startedOne()
	p.mu.Unlock()
	return p.d.Spawn(ctx, cg, p.flags)
}

// poolName is a new cgroup name of the pool's own; the caller holds p.mu.
func (p *Pool) poolName() string {
	p.next++
	return path.Join(p.parent, fmt.Sprintf("%s%d", poolPrefix, p.next))
}

// startedOne ends the start of the inflight init; the caller holds p.mu.
func (p *Pool) startedOne() {
	if p.inflight != "" {
		p.inflight = ""
		p.spawned.Broadcast()
	}
}

// PrepOf is the early part of the plan of a branch with spec, for the
// inits started ahead of forks like it; nil if none.
func PrepOf(ctx context.Context, spec *specs.Spec) []byte {
	// The rootfs, cgroup and seccomp program are the late part's.
	plan, err := brinit.NewPlan(spec, "/", map[string]string{}, nil)
	if err != nil {
		log.G(ctx).WithError(err).Debug("plan the early part of a branch's root")
		return nil
	}
	early, _, ok := brinit.SplitPrep(plan.Conf.Ops())
	if !ok {
		return nil
	}
	return bytes.Clone(early.Bytes())
}

// prep sends a spawned init the early part of a plan and waits for it to
// be done; where the node's root mount is shared, the init makes its mount
// namespace first (op mntns).
func (s *Spawned) prep(early []byte, sharedRoot bool) error {
	msg := []byte{'P'}
	if sharedRoot {
		var w brinit.Config
		w.Op("mntns")
		msg = append(msg, w.Bytes()...)
	}
	msg = append(msg, early...)
	if _, err := s.ctl.Write(msg); err != nil {
		return fmt.Errorf("send the branch init its early set-up: %w", err)
	}
	_ = s.ctl.SetReadDeadline(time.Now().Add(time.Minute))
	defer func() { _ = s.ctl.SetReadDeadline(time.Time{}) }()
	if err := initReply(s.ctl, 'p'); err != nil {
		return fmt.Errorf("early set-up: %w", err)
	}
	s.prepped = bytes.Clone(early)
	return nil
}
