package shim

import (
	"fmt"
	"os"
	"sync"
	"time"
)

var profMu sync.Mutex

type prof struct {
	t0   time.Time
	last time.Time
	s    string
}

func newProf() *prof { t := time.Now(); return &prof{t0: t, last: t} }

func (p *prof) mark(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.s += fmt.Sprintf(" %s=%d", name, now.Sub(p.last).Microseconds())
	p.last = now
}

func (p *prof) done(kind string) {
	if p == nil {
		return
	}
	profMu.Lock()
	defer profMu.Unlock()
	f, err := os.OpenFile("/tmp/forkprof.log", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%s total=%d%s\n", kind, time.Since(p.t0).Microseconds(), p.s)
	f.Close()
}

var cgGate sync.RWMutex
