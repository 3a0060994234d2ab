//go:build !cgo || !seccomp

package seccompbpf

import (
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runc/libcontainer/configs"
)

// Enabled says whether this build compiles seccomp profiles (cgo and the
// seccomp build tag, as runc's).
const Enabled = false

// Compile needs libseccomp: build with -tags seccomp.
func Compile(*configs.Seccomp) (*Program, error) {
	return nil, fmt.Errorf("compile seccomp profile: built without libseccomp (-tags seccomp): %w", errdefs.ErrNotImplemented)
}
