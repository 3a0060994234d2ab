//go:build linux

package snapshotter

import (
	"context"

	"github.com/containerd/log"

	"github.com/branchbox/branchbox/snapshotter/apply"
)

// applyLayer is the default commit engine: it makes target show upper
// over its own contents, never leaving either tree.
func applyLayer(ctx context.Context, upper, target string) error {
	st, err := apply.Apply(ctx, upper, target)
	if err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"files": st.Files, "dirs": st.Dirs, "whiteouts": st.Whiteouts, "bytes": st.Bytes}).Debug("applied branch layer")
	return nil
}
