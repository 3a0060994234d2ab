//go:build linux

package initdriver

import "time"

// A sandbox's operations mark themselves active on its pool, so that the
// refill starts inits only between them (waitQuiet, refill.go).

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
