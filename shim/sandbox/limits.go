package sandbox

import (
	"fmt"

	"github.com/containerd/errdefs"
)

// The bounds of the limits a fork asks for, checked where they enter so
// that a bad number is refused at once, not by the kernel or the OOM
// killer once the branch runs.
const (
	// MinBranchMemory is the smallest memory limit of a branch: Docker's
	// minimum, below which a process cannot even start.
	MinBranchMemory = 6 << 20
	// MinBranchCPUs is the smallest CPU limit: the kernel's minimum CFS
	// quota (1 ms) over the 100 ms period branches use.
	MinBranchCPUs = 0.01
	// MaxBranchCPUs keeps the quota (CPUs x 100,000 us) well inside the
	// kernel's maximum CFS quota.
	MaxBranchCPUs = 1 << 20
	// MaxBranchPids is the kernel's PID_MAX_LIMIT.
	MaxBranchPids = 1 << 22
	// maxSignal is the kernel's highest signal number (_NSIG, SIGRTMAX).
	maxSignal = 64
)

// checkSignal refuses a signal number the kernel does not have (it would
// answer EINVAL, reported as an internal error); 0 is not a signal to send
// either: it only asks whether the process exists.
func checkSignal(sig uint32) error {
	if sig < 1 || sig > maxSignal {
		return fmt.Errorf("kill: signal %d is out of range: give 1 to %d: %w", sig, maxSignal, errdefs.ErrInvalidArgument)
	}
	return nil
}
