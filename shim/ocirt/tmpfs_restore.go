//go:build linux

package ocirt

// The restore side of tmpfs.go: each tmpfs mount the runtime copied at the
// dump is mounted anew below the restore's work directory, with the
// options it had, filled from its archive, made private, and given to CRIU
// as the source of the external mount of that key (ext-mount-map, in a
// CRIU configuration file libcontainer's Restore passes on). CRIU binds it
// into the branch's mount namespace, applies the mount's flags and
// propagation from the image, and once the restore is done the runtime
// detaches its own mount: the branch's holds the tmpfs.

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/safeopen"
)

// criuConfigAnnotation names the CRIU configuration file libcontainer's
// Restore gives CRIU (else /etc/criu/runc.conf).
const (
	criuConfigAnnotation = "org.criu.config"
	defaultCriuConfig    = "/etc/criu/runc.conf"
)

// tmpfsCopies mounts and fills the tmpfs mounts the image's dump copied,
// and the sysfs mounts it left external (sysfs.go), below work, and points
// spec's CRIU configuration at a file mapping each to its key (what the
// spec or runc's default configuration held, first). undo detaches the
// mounts and removes what it made; it is a no-op for an image without any.
func tmpfsCopies(images, work string, spec *specs.Spec) (undo func(), err error) {
	undo = func() {}
	var mounts []tmpfsMount
	index, err := os.ReadFile(filepath.Join(images, tmpfsIndex))
	if err == nil {
		if err := json.Unmarshal(index, &mounts); err != nil {
			return undo, fmt.Errorf("%s: %w", tmpfsIndex, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return undo, err
	}
	sysfs, err := readSysfsIndex(images)
	if err != nil || (len(mounts) == 0 && len(sysfs) == 0) {
		return undo, err
	}
	dir, err := copiesDir(work, spec)
	if err != nil {
		return undo, err
	}
	e := &extMounts{dir: dir, mounted: map[string]bool{}, conf: criuConfigOf(spec)}
	undo = e.undo
	defer func() {
		if err != nil {
			undo()
		}
	}()
	for i, m := range mounts {
		if err = e.tmpfs(images, i, m); err != nil {
			return undo, err
		}
	}
	for i, m := range sysfs {
		if err = e.sysfs(i, m, specNetNS(spec)); err != nil {
			return undo, err
		}
	}
	err = writeCriuConfig(e.dir, e.conf, spec)
	return undo, err
}

// copiesDir makes the directory below work that the copies are mounted in.
func copiesDir(work string, spec *specs.Spec) (string, error) {
	if inUserNS(spec) {
		// CRIU binds them from inside the user namespace it restores
		// the processes in, as its root (a host uid of its range), which
		// must be able to reach them.
		return searchableDir(work, "tmpfs-")
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return "", err
	}
	return os.MkdirTemp(work, "tmpfs-")
}

// searchableDir makes a new directory below work, named from prefix, that
// any user can search but not list, and makes work so too.
func searchableDir(work, prefix string) (string, error) {
	if err := os.MkdirAll(work, 0o700); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(work, prefix)
	if err != nil {
		return "", err
	}
	for _, d := range []string{work, dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			os.Remove(dir)
			return "", err
		}
	}
	return dir, nil
}

// extMounts are the mounts a restore makes for CRIU to bind in place of
// the image's external ones, and the CRIU configuration that maps them.
type extMounts struct {
	dir     string
	targets []string
	mounted map[string]bool
	conf    []string
}

// undo detaches and removes them. Never a RemoveAll: a mount CRIU bound
// into the container shares its content with the one here.
func (e *extMounts) undo() {
	for _, t := range e.targets {
		if !e.mounted[t] || unix.Unmount(t, unix.MNT_DETACH) == nil {
			_ = os.Remove(t)
		}
	}
	_ = os.Remove(filepath.Join(e.dir, "criu.conf"))
	_ = os.Remove(e.dir)
}

// tmpfs mounts and fills the copy of the image's i-th tmpfs mount m.
func (e *extMounts) tmpfs(images string, i int, m tmpfsMount) error {
	target := filepath.Join(e.dir, strconv.Itoa(i))
	if err := validTmpfsEntry(m); err != nil {
		return err
	}
	if err := os.Mkdir(target, 0o700); err != nil {
		return err
	}
	e.targets = append(e.targets, target)
	if err := fillTmpfs(images, target, m, func() { e.mounted[target] = true }); err != nil {
		return err
	}
	for _, p := range m.Mountpoints {
		e.conf = append(e.conf, fmt.Sprintf("ext-mount-map \"%s:%s\"", p, target))
	}
	return nil
}

// sysfs mounts the i-th external sysfs mount m for network namespace netns.
func (e *extMounts) sysfs(i int, m sysfsMount, netns string) error {
	if netns == "" {
		return fmt.Errorf("sysfs %s: the spec joins no network namespace to mount it for", m.Mountpoint)
	}
	target := filepath.Join(e.dir, fmt.Sprintf("sys-%d", i))
	if err := os.Mkdir(target, 0o700); err != nil {
		return err
	}
	e.targets = append(e.targets, target)
	if err := mountSysfs(target, netns, m.Flags); err != nil {
		return fmt.Errorf("sysfs %s: %w", m.Mountpoint, err)
	}
	e.mounted[target] = true
	e.conf = append(e.conf, fmt.Sprintf("ext-mount-map \"%s:%s\"", m.Mountpoint, target))
	return nil
}

// writeCriuConfig writes the CRIU configuration conf into dir and points
// spec at it.
func writeCriuConfig(dir string, conf []string, spec *specs.Spec) error {
	file := filepath.Join(dir, "criu.conf")
	if strings.ContainsAny(file, "\"\n") {
		return fmt.Errorf("work directory %q: CRIU's configuration cannot name it", filepath.Dir(dir))
	}
	if err := os.WriteFile(file, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	spec.Annotations[criuConfigAnnotation] = file
	return nil
}

// validTmpfsEntry refuses an index entry that would name a file outside
// the image or break CRIU's configuration file.
func validTmpfsEntry(m tmpfsMount) error {
	if len(m.Mountpoints) == 0 || strings.ContainsAny(m.File, "/\"\n") {
		return fmt.Errorf("%s: invalid entry %+v", tmpfsIndex, m)
	}
	for _, p := range m.Mountpoints {
		if !path.IsAbs(p) || strings.ContainsAny(p, "\"\n") {
			return fmt.Errorf("%s: invalid mount point %q", tmpfsIndex, p)
		}
	}
	return nil
}

// fillTmpfs mounts at target a private tmpfs as m was mounted (mounted is
// called once it is), fills it from its archive in images and makes it
// read-only if m was.
func fillTmpfs(images, target string, m tmpfsMount, mounted func()) error {
	if err := unix.Mount("tmpfs", target, "tmpfs", m.Flags&^unix.MS_RDONLY, m.Data); err != nil {
		return fmt.Errorf("tmpfs %s: mount (%s): %w", m.Mountpoints[0], m.Data, err)
	}
	mounted()
	if err := unix.Mount("", target, "", unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := extractTmpfs(filepath.Join(images, m.File), target); err != nil {
		return fmt.Errorf("tmpfs %s: %w", m.Mountpoints[0], err)
	}
	if m.ReadOnly {
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_RDONLY|(m.Flags&^unix.MS_RDONLY), m.Data); err != nil {
			return fmt.Errorf("tmpfs %s: remount read-only: %w", m.Mountpoints[0], err)
		}
	}
	return nil
}

// criuConfigOf is the lines of the CRIU configuration libcontainer would
// have given CRIU for spec, kept in the one the runtime writes.
func criuConfigOf(spec *specs.Spec) []string {
	file := defaultCriuConfig
	if f, ok := spec.Annotations[criuConfigAnnotation]; ok {
		file = f
	}
	if file == "" {
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil // CRIU ignores a missing one too
	}
	return []string{strings.TrimRight(string(b), "\n")}
}

// extractTmpfs fills dir from the archive file, as archive wrote it. The
// archive may come from a registry: every name is resolved beneath dir
// without following a symlink, and its size and entries are bounded as
// the dump's were.
func extractTmpfs(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	tr := tar.NewReader(f)
	var dirs []*tar.Header
	var size int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		size += h.Size
		if n > tmpfsCopyEntries || size > tmpfsCopyBytes {
			return fmt.Errorf("%s holds more than a copied tmpfs may", filepath.Base(file))
		}
		if err := extractEntry(root, tr, h); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, h)
		}
	}
	// A directory's times last: its entries' creation changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := entryTimes(root, dirs[i]); err != nil {
			return fmt.Errorf("%s: %w", dirs[i].Name, err)
		}
	}
	return nil
}

// entryAt opens the parent of a header's name beneath root, and gives its
// last element ("." for the root itself).
func entryAt(root int, name string) (parent int, base string, err error) {
	clean := path.Clean("/" + name)[1:]
	if clean == "" {
		p, err := unix.Dup(root)
		return p, ".", err
	}
	p, err := safeopen.OpenBeneath(root, "./"+path.Dir(clean), unix.O_PATH|unix.O_DIRECTORY)
	return p, path.Base(clean), err
}

func extractEntry(root int, tr *tar.Reader, h *tar.Header) error {
	parent, base, err := entryAt(root, h.Name)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	mode := uint32(h.Mode & 0o7777)
	switch h.Typeflag {
	case tar.TypeDir:
		if base != "." {
			if err := unix.Mkdirat(parent, base, 0o700); err != nil {
				return err
			}
		}
	case tar.TypeReg:
		fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		w := os.NewFile(uintptr(fd), base)
		_, err = io.Copy(w, tr)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		return chownTimes(parent, base, h, unix.Symlinkat(h.Linkname, parent, base))
	case tar.TypeLink:
		tp, tbase, err := entryAt(root, h.Linkname)
		if err != nil {
			return err
		}
		defer unix.Close(tp)
		return unix.Linkat(tp, tbase, parent, base, 0)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[h.Typeflag]
		if err := unix.Mknodat(parent, base, kind|0o600, int(unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor)))); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unexpected entry type %q", h.Typeflag)
	}
	if err := chownTimes(parent, base, h, nil); err != nil {
		return err
	}
	// After the owner: a chown clears the set-id bits.
	return unix.Fchmodat(parent, base, mode, 0)
}

// chownTimes gives the entry made (made: its error) its owner and, if it
// is not a directory, its times.
func chownTimes(parent int, base string, h *tar.Header, made error) error {
	if made != nil {
		return made
	}
	if err := unix.Fchownat(parent, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if h.Typeflag == tar.TypeDir {
		return nil
	}
	return setTimes(parent, base, h)
}

func entryTimes(root int, h *tar.Header) error {
	parent, base, err := entryAt(root, h.Name)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	return setTimes(parent, base, h)
}

func setTimes(parent int, base string, h *tar.Header) error {
	t := unix.NsecToTimespec(h.ModTime.UnixNano())
	return unix.UtimesNanoAt(parent, base, []unix.Timespec{t, t}, unix.AT_SYMLINK_NOFOLLOW)
}

// inUserNS says whether a spec's processes run in a user namespace.
func inUserNS(spec *specs.Spec) bool {
	if spec.Linux == nil {
		return false
	}
	for _, n := range spec.Linux.Namespaces {
		if n.Type == specs.UserNamespace {
			return true
		}
	}
	return false
}
