//go:build linux

package sandbox

import (
	"strings"

	"google.golang.org/grpc/status"

	"github.com/branchbox/branchbox/branch"
)

// hostless words an answer for a caller inside the sandbox, already
// converted for the wire (toTTRPC): the snapshotter's root, a host path
// the refusals of a full disk name ("no room ... under ROOT"), becomes
// "the snapshotter's root". Its code and details (a checkpoint bound's
// figures, a stale branch's winner) are kept. A sandbox is not shown the
// host's paths, as the memory image's refusal words it (memfork_room.go).
func (s *selfService) hostless(err error) error {
	if err == nil {
		return nil
	}
	sb, serr := s.c.Sandbox(s.sandbox)
	if serr != nil {
		return err
	}
	return hostlessIn(err, sb.upper)
}

// hostlessIn is hostless for the sandbox whose upper directory is upper.
func hostlessIn(err error, upper string) error {
	root, rerr := branch.RootOfUpper(upper)
	if rerr != nil || root == "" || !strings.Contains(err.Error(), root) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	p := st.Proto()
	p.Message = strings.ReplaceAll(p.Message, root, "the snapshotter's root")
	return status.FromProto(p).Err()
}
