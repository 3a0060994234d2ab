//go:build linux

package snapshotter

import (
	"context"

	"github.com/containerd/log"

	"github.com/branchbox/branchbox/snapshotter/apply"
)

// applyLayer makes target show upper over its own contents, never leaving
// either tree. resume removes the temporaries of an attempt cut short.
// targetUpper, if not "", is the upper directory of target's overlay,
// which Apply reads to replace entries faster. j, if not nil, records the
// pre-image of what the apply changes in target's upper.
func applyLayer(ctx context.Context, upper, target, targetUpper string, resume bool, j *apply.Journal) error {
	var opts []apply.Opt
	if j != nil {
		opts = append(opts, apply.WithJournal(j))
	}
	if targetUpper != "" {
		opts = append(opts, apply.WithTargetUpper(targetUpper))
	}
	if resume {
		opts = append(opts, apply.WithStaleTempRemoval())
	}
	st, err := apply.Apply(ctx, upper, target, opts...)
	if err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"files": st.Files, "dirs": st.Dirs, "whiteouts": st.Whiteouts, "bytes": st.Bytes}).Debug("applied branch layer")
	return nil
}
