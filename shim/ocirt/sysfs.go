//go:build linux

package ocirt

// A container in a user namespace is restored by CRIU in a new user
// namespace with the same mappings (the shim's restoredUserNS), which
// holds no right over the network namespace it joins (owned by the
// container's): it may not mount a sysfs for it ("Unable to mount sysfs
// ...: Operation not permitted"). The dump marks such a container's sysfs
// mounts external and lists them (sysfsIndex); the restore mounts a sysfs
// for that network namespace from outside, with the same flags, and maps
// each to it, as it does for its tmpfs copies.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	criurpc "github.com/checkpoint-restore/go-criu/v7/rpc"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/branchbox/branchbox/internal/procfd"
)

// sysfsIndex, in an image, lists the sysfs mounts its dump left external.
const sysfsIndex = "branchbox-sysfs.json"

// sysfsMount is a sysfs mount of the container: where, and its flags.
type sysfsMount struct {
	Mountpoint string  `json:"mountpoint"`
	Flags      uintptr `json:"flags"`
}

// externalSysfs marks the sysfs mounts of the container whose init is pid
// external in opts, and lists them in the image directory images.
func externalSysfs(opts *criurpc.CriuOpts, pid int, images string) error {
	infos, err := procfd.Mountinfo(pid)
	if err != nil {
		return err
	}
	var out []sysfsMount
	for _, m := range infos {
		if m.FSType != "sysfs" {
			continue
		}
		flags, ok := mountFlags(m.Options)
		if !ok {
			return fmt.Errorf("sysfs %s: mount options %q", m.Mountpoint, m.Options)
		}
		out = append(out, sysfsMount{Mountpoint: m.Mountpoint, Flags: flags})
		opts.ExtMnt = append(opts.ExtMnt, &criurpc.ExtMountMap{Key: proto.String(m.Mountpoint), Val: proto.String(m.Mountpoint)})
	}
	if len(out) == 0 {
		return nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(images, sysfsIndex), b, 0o600)
}

// readSysfsIndex is the image's external sysfs mounts (none without an
// index).
func readSysfsIndex(images string) ([]sysfsMount, error) {
	b, err := os.ReadFile(filepath.Join(images, sysfsIndex))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []sysfsMount
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", sysfsIndex, err)
	}
	for _, m := range out {
		if !path.IsAbs(m.Mountpoint) || strings.ContainsAny(m.Mountpoint, "\"\n") {
			return nil, fmt.Errorf("%s: invalid mount point %q", sysfsIndex, m.Mountpoint)
		}
	}
	return out, nil
}

// mountSysfs mounts at target a sysfs of the network namespace at netns,
// with flags: sysfs shows the namespace of the process that mounts it.
func mountSysfs(target, netns string, flags uintptr) error {
	errc := make(chan error, 1)
	go func() {
		// Not unlocked: the thread ends with this goroutine, whichever
		// namespace it is left in.
		runtime.LockOSThread()
		fd, err := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("join network namespace %s: %w", netns, err)
			return
		}
		errc <- unix.Mount("sysfs", target, "sysfs", flags, "")
	}()
	return <-errc
}

// specNetNS is the network namespace a spec joins, or "".
func specNetNS(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, n := range spec.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace {
			return n.Path
		}
	}
	return ""
}
