//go:build linux

package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/runc"
	"github.com/containerd/log"
)

// keptOptionsFile, in a sandbox's bundle, is a copy of its runtime
// options written whole (a temporary file renamed). The task service
// writes options.json in place, truncating it first, each time the
// sandbox's task is created, which a rollback with processes does again:
// a shim killed in between left it empty, and containerd's cleanup of the
// dead shim, which reads it for the runtime's root, failed ("read runtime
// options of SB: unexpected end of JSON input"), leaving the sandbox's
// mounts and runtime state behind.
const keptOptionsFile = "options.kept.json"

// KeepOptions keeps a copy of the sandbox's runtime options in its bundle
// for DeadShimOptions.
func KeepOptions(bundle string, opts *options.Options) error {
	data, err := json.Marshal(opts)
	if err != nil {
		return err
	}
	tmp := filepath.Join(bundle, keptOptionsFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(bundle, keptOptionsFile))
}

// DeadShimOptions are the runtime options of the sandbox whose bundle
// this is, for the cleanup after its shim died: options.json, or, if
// that cannot be read, the copy KeepOptions kept (nil if there is none
// either: the defaults).
func DeadShimOptions(ctx context.Context, bundle string) (*options.Options, error) {
	opts, err := runc.ReadOptions(bundle)
	if err == nil {
		return opts, nil
	}
	data, kerr := os.ReadFile(filepath.Join(bundle, keptOptionsFile))
	if kerr != nil {
		if os.IsNotExist(kerr) {
			return nil, err
		}
		return nil, fmt.Errorf("%w (and its kept copy: %v)", err, kerr)
	}
	var kept options.Options
	if kerr := json.Unmarshal(data, &kept); kerr != nil {
		return nil, fmt.Errorf("%w (and its kept copy: %v)", err, kerr)
	}
	log.G(ctx).WithError(err).WithField("bundle", bundle).Warn("runtime options unreadable (a shim killed while it rewrote them): using the kept copy")
	return &kept, nil
}
