package sandbox

import (
	"math"
	"testing"

	"github.com/containerd/errdefs"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
)

func TestCheckLimits(t *testing.T) {
	for _, c := range []struct {
		l  *shimv1.Limits
		ok bool
	}{
		{&shimv1.Limits{}, true},
		{&shimv1.Limits{Memory: 64 << 20, Cpus: 0.5, Pids: 100}, true},
		{&shimv1.Limits{Cpus: 0.01}, true},
		{&shimv1.Limits{Memory: 1}, false},
		{&shimv1.Limits{Memory: -1}, false},
		{&shimv1.Limits{Cpus: math.NaN()}, false},
		{&shimv1.Limits{Cpus: math.Inf(1)}, false},
		{&shimv1.Limits{Cpus: math.Inf(-1)}, false},
		{&shimv1.Limits{Cpus: 1e-12}, false},
		{&shimv1.Limits{Cpus: -1}, false},
		{&shimv1.Limits{Cpus: 1e300}, false},
		{&shimv1.Limits{Pids: -1}, false},
		{&shimv1.Limits{Pids: 1 << 40}, false},
	} {
		err := checkLimits(c.l)
		if c.ok != (err == nil) || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("limits %+v: got %v, want ok %v (else invalid argument)", c.l, err, c.ok)
		}
	}
}

func TestCheckSignal(t *testing.T) {
	for sig, ok := range map[uint32]bool{0: false, 1: true, 9: true, 15: true, 64: true, 65: false, 1 << 31: false} {
		err := checkSignal(sig)
		if ok != (err == nil) || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("signal %d: got %v, want ok %v (else invalid argument)", sig, err, ok)
		}
	}
}
