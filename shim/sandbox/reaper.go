//go:build linux

package sandbox

import (
	"time"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/process"
	runcC "github.com/containerd/go-runc"
)

// The reaper: exits of branch processes, matched to the processes waiting for
// them.

func (c *Service) reap(ec chan runcC.Exit) {
	for e := range ec {
		c.pidMu.Lock()
		p, ok := c.pids[e.Pid]
		if ok {
			delete(c.pids, e.Pid)
		} else {
			now := time.Now()
			c.pending[e.Pid] = pendingExit{e: e, at: now}
			if len(c.pending) > 512 {
				for pid, pe := range c.pending {
					if now.Sub(pe.at) > 30*time.Second {
						delete(c.pending, pid)
					}
				}
			}
		}
		c.pidMu.Unlock()
		if ok {
			p.SetExited(e.Status)
		}
	}
}

// watch routes p's exit to it; started is when p was started, so that an
// exit of an earlier process with the same pid is not taken for p's.
func (c *Service) watch(p process.Process, started time.Time) {
	pid := p.Pid()
	if pid <= 0 {
		return
	}
	c.pidMu.Lock()
	if pe, ok := c.pending[pid]; ok && !pe.at.Before(started) {
		delete(c.pending, pid)
		c.pidMu.Unlock()
		p.SetExited(pe.e.Status)
		return
	}
	c.pids[pid] = p
	c.pidMu.Unlock()
}
