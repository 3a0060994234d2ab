// Package seccompbpf compiles an OCI seccomp profile into the classic BPF
// program and seccomp(2) flags that runc would load for it, so that a
// process other than runc's init (the branch init, which is C with no Go
// runtime) can install exactly runc's filter.
package seccompbpf

import (
	"encoding/binary"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// Program is a compiled profile: what seccomp(SECCOMP_SET_MODE_FILTER,
// Flags, {len(Filter), Filter}) takes.
type Program struct {
	Filter []unix.SockFilter
	Flags  uint // SECCOMP_FILTER_FLAG_*
}

// Bytes is the program's instructions in the host's byte order, as the
// kernel takes them (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k).
func (p *Program) Bytes() []byte {
	b := make([]byte, 0, 8*len(p.Filter))
	for _, in := range p.Filter {
		b = binary.NativeEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.NativeEndian.AppendUint32(b, in.K)
	}
	return b
}

// HasNotify says whether a profile hands syscalls to a user-space agent
// (SCMP_ACT_NOTIFY), which needs the runtime's seccomp listener.
func HasNotify(config *configs.Seccomp) bool {
	if config == nil {
		return false
	}
	if config.DefaultAction == configs.Notify {
		return true
	}
	for _, c := range config.Syscalls {
		if c != nil && c.Action == configs.Notify {
			return true
		}
	}
	return false
}
