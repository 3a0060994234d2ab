//go:build linux

package sandbox

import (
	"context"

	"github.com/branchbox/branchbox/shim/initdriver"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// useInit says whether the branch of spec is started by the branch init,
// and logs, once per sandbox (and again if the answer changes), which way
// its branches go and why.
func (c *Service) useInit(ctx context.Context, sb *sandbox, spec *specs.Spec) bool {
	reason := ""
	if c.inits.Binary == "" {
		reason = "the branch init (" + initdriver.InitBinary + ") is not installed beside the shim"
	} else if sb.opts != nil && sb.opts.NoPivotRoot {
		reason = "runtime option NoPivotRoot: the branch init always pivots"
	} else if reason = initdriver.Unsupported(spec); reason == "" && spec.Linux.Seccomp != nil {
		if _, err := sb.initPath.Seccomp(ctx, spec.Linux.Seccomp); err != nil {
			reason = "seccomp profile not compiled for the branch init: " + err.Error()
		}
	}
	sb.initPath.Log(ctx, sb.id, reason, spec.Linux.Seccomp != nil)
	return reason == ""
}
