//go:build linux

package overlay

import (
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// UpperIs tells whether the overlay of mount table entry m has upper as its
// upper directory. The kernel lists an overlay's directories as they were
// given, with a space, a tab, a newline, a comma or a backslash in them
// escaped (\040); mountinfo unescapes the mount point but not the
// filesystem's options, so a root whose path has a space must be matched
// here or its live overlay is not found (and not sealed). containerd
// shortens long options by making the lower directories relative, never
// the upper, so an upper that is not absolute matches nothing.
func UpperIs(m *mountinfo.Info, upper string) bool {
	u := upperOf(m)
	return filepath.IsAbs(u) && filepath.Clean(u) == filepath.Clean(upper)
}

// upperOf is the upper directory of the overlay of m, unescaped; "" if it
// has none.
func upperOf(m *mountinfo.Info) string {
	for _, o := range strings.Split(m.VFSOptions, ",") {
		if v, ok := strings.CutPrefix(o, "upperdir="); ok {
			return unescapeOctal(v)
		}
	}
	return ""
}

// unescapeOctal undoes the kernel's \ooo escapes of mountinfo fields.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
