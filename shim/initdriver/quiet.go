//go:build linux

package initdriver

import "time"

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

// Active marks an operation of the sandbox (a fork, a commit, an abort,
// an exec) as running until done is called.
func (p *Pool) Active() (done func()) {
	p.mu.Lock()
	p.busy++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.busy--
		p.lastActive = time.Now()
		p.mu.Unlock()
		p.wakeUp()
	}
}

// wakeUp has a refill waiting for quiet look again.
func (p *Pool) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

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
