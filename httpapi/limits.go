//go:build linux

package httpapi

import (
	"fmt"
	"sync"

	"github.com/containerd/errdefs"
)

// limits counts what each client holds at once: running execs and open
// streams (exec output, events). A client is a token, or on the unix
// socket a peer's uid (clientKey).
type limits struct {
	maxExecs, maxStreams int

	mu      sync.Mutex
	execs   map[string]int
	streams map[string]int
}

func newLimits(maxExecs, maxStreams int) *limits {
	return &limits{maxExecs: maxExecs, maxStreams: maxStreams, execs: map[string]int{}, streams: map[string]int{}}
}

// acquire takes one of a client's execs (exec true) or streams, or fails
// with ResourceExhausted; release gives it back.
func (l *limits) acquire(client string, exec bool) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, max, what := l.streams, l.maxStreams, "streams"
	if exec {
		m, max, what = l.execs, l.maxExecs, "execs"
	}
	if max > 0 && m[client] >= max {
		return nil, fmt.Errorf("this client already has %d %s running, the server's limit (branchctl serve --max-%s); wait for one to end: %w", m[client], what, what, errdefs.ErrResourceExhausted)
	}
	m[client]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if m[client]--; m[client] <= 0 {
				delete(m, client)
			}
		})
	}, nil
}
