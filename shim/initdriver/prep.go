//go:build linux

package initdriver

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/branchbox/branchbox/shim/brinit"
	"github.com/containerd/log"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// An init started ahead of a fork does the early part of its plan
// (brinit.SplitPrep) before the fork.

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
// be done.
func (s *Spawned) prep(early []byte) error {
	msg := append([]byte{'P'}, early...)
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
