//go:build linux && cgo && seccomp

package seccompbpf

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// seccompData is struct seccomp_data, what a seccomp program reads.
type seccompData struct {
	nr   int32
	arch uint32
	ip   uint64
	args [6]uint64
}

func (d *seccompData) bytes() []byte {
	b := make([]byte, 64)
	binary.NativeEndian.PutUint32(b[0:], uint32(d.nr))
	binary.NativeEndian.PutUint32(b[4:], d.arch)
	binary.NativeEndian.PutUint64(b[8:], d.ip)
	for i, a := range d.args {
		binary.NativeEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// run interprets a classic BPF seccomp program over d as the kernel does
// (the instructions seccomp accepts) and returns its verdict.
func run(prog []unix.SockFilter, d *seccompData) (uint32, error) {
	data := d.bytes()
	var a, x uint32
	var mem [16]uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		k := in.K
		src := k
		if in.Code&unix.BPF_X != 0 {
			src = x
		}
		switch in.Code & 0x07 {
		case unix.BPF_LD:
			switch in.Code {
			case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
				if k+4 > uint32(len(data)) {
					return 0, fmt.Errorf("pc %d: load at %d", pc, k)
				}
				a = binary.NativeEndian.Uint32(data[k:])
			case unix.BPF_LD | unix.BPF_W | unix.BPF_LEN:
				a = uint32(len(data))
			case unix.BPF_LD | unix.BPF_IMM:
				a = k
			case unix.BPF_LD | unix.BPF_MEM:
				a = mem[k]
			default:
				return 0, fmt.Errorf("pc %d: ld %#x", pc, in.Code)
			}
		case unix.BPF_LDX:
			switch in.Code {
			case unix.BPF_LDX | unix.BPF_W | unix.BPF_LEN:
				x = uint32(len(data))
			case unix.BPF_LDX | unix.BPF_IMM:
				x = k
			case unix.BPF_LDX | unix.BPF_MEM:
				x = mem[k]
			default:
				return 0, fmt.Errorf("pc %d: ldx %#x", pc, in.Code)
			}
		case unix.BPF_ST:
			mem[k] = a
		case unix.BPF_STX:
			mem[k] = x
		case unix.BPF_ALU:
			switch in.Code & 0xf0 {
			case unix.BPF_ADD:
				a += src
			case unix.BPF_SUB:
				a -= src
			case unix.BPF_MUL:
				a *= src
			case unix.BPF_DIV:
				if src == 0 {
					return 0, nil
				}
				a /= src
			case unix.BPF_OR:
				a |= src
			case unix.BPF_AND:
				a &= src
			case unix.BPF_LSH:
				a <<= src
			case unix.BPF_RSH:
				a >>= src
			case unix.BPF_NEG:
				a = -a
			case unix.BPF_XOR:
				a ^= src
			default:
				return 0, fmt.Errorf("pc %d: alu %#x", pc, in.Code)
			}
		case unix.BPF_JMP:
			var cond bool
			switch in.Code & 0xf0 {
			case unix.BPF_JA:
				pc += int(k)
				continue
			case unix.BPF_JEQ:
				cond = a == src
			case unix.BPF_JGT:
				cond = a > src
			case unix.BPF_JGE:
				cond = a >= src
			case unix.BPF_JSET:
				cond = a&src != 0
			default:
				return 0, fmt.Errorf("pc %d: jmp %#x", pc, in.Code)
			}
			if cond {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case unix.BPF_RET:
			if in.Code&0x18 == unix.BPF_A {
				return a, nil
			}
			return k, nil
		case unix.BPF_MISC:
			if in.Code&0xf8 == unix.BPF_TAX {
				x = a
			} else {
				a = x
			}
		}
	}
	return 0, fmt.Errorf("program ran off its end")
}
