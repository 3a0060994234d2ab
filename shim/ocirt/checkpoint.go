//go:build linux

package ocirt

// checkpoint and restore: runc's commands of those names, for the memory
// forks of branches (docs/memory-fork.md) and containerd's checkpoints of
// a task (docs/runtime.md). Restore is runc's, on libcontainer's Restore.
// Checkpoint drives CRIU itself (go-criu, as libcontainer does) for what
// libcontainer's Checkpoint cannot serve a memory fork: the cgroup CRIU
// freezes must be the one the sandbox's processes are in (a sealed
// sandbox's are in a frozen leaf below its cgroup, which CRIU must thaw
// and refreeze itself, or it waits forever for them), the network
// namespace is always external, so that each branch restored from the
// image joins the namespace the shim gives it, and the runtime's own
// shortcuts (MemoryForkFlag). Everything else is what libcontainer's
// Checkpoint sends, so that its Restore, and runc's, read the image as
// their own: the same external mount keys, descriptors.json.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	criu "github.com/checkpoint-restore/go-criu/v7"
	criurpc "github.com/checkpoint-restore/go-criu/v7/rpc"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// descriptorsFile is where libcontainer's Restore looks for the init's
// standard descriptors.
const descriptorsFile = "descriptors.json"

// ExtNetNSKey is the key under which a dump records the sandbox's network
// namespace as external, and a restore is handed the one to join
// (libcontainer's criuNsToKey(NEWNET)).
const ExtNetNSKey = "extRootNetNS"

// prepareCriu puts the directory of this binary first on PATH if CRIU is
// there (make install puts it beside the shim): go-criu, in our dump and
// in libcontainer's restore, runs "criu" from PATH. Then it sees that CRIU
// finds its kernel-feature cache (kerndat.go).
func prepareCriu() {
	if self, err := os.Executable(); err == nil {
		dir := filepath.Dir(self)
		if fi, err := os.Stat(filepath.Join(dir, "criu")); err == nil && fi.Mode().IsRegular() {
			_ = os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		}
	}
	path, err := exec.LookPath("criu")
	if err != nil {
		return // the dump or restore says so
	}
	if err := ensureKerndatCache(path); err != nil {
		logrus.WithError(err).Warn("criu will probe the kernel's features itself")
	}
}

// checkpoint is runc checkpoint: it dumps the container's init and its
// descendants into --image-path. With --leave-running they run on after
// the dump; --freeze-cgroup names a cgroup (a directory under
// /sys/fs/cgroup) they were frozen in, which CRIU thaws under ptrace and
// refreezes after the dump, as it does the container's own cgroup when
// the container is paused.
func checkpoint(c *cmdline) error {
	prepareCriu()
	container, st, paused, err := checkpointable(c)
	if err != nil {
		return err
	}
	images := c.str("image-path")
	if images == "" {
		return errors.New("checkpoint: --image-path is required")
	}
	if err := os.MkdirAll(images, 0o700); err != nil {
		return err
	}
	imageDir, err := os.Open(images)
	if err != nil {
		return err
	}
	defer imageDir.Close()
	freeze := c.str("freeze-cgroup")
	if freeze == "" && paused {
		// containerd's client pauses a task before it checkpoints it
		// (nerdctl checkpoint create, ctr, the CRI's checkpoint): CRIU
		// must thaw it under ptrace and freeze it again, as for runc,
		// or it waits on the frozen processes until its timeout.
		if freeze, err = freezerOf(st); err != nil {
			return err
		}
	}
	config := container.Config()
	// Only a memory fork's image has the runtime copy the small tmpfs
	// mounts: runc's restore would not know those mounts.
	err = dump(c, &config, st, imageDir, images, freeze, c.bool(MemoryForkFlag))
	if errors.Is(err, errTmpfsGrew) {
		// Again, with CRIU archiving every tmpfs mount itself.
		if err := emptyDir(images); err != nil {
			return err
		}
		err = dump(c, &config, st, imageDir, images, freeze, false)
	}
	return err
}

// freezerOf is the cgroup that freezes the container of state st.
func freezerOf(st *libcontainer.State) (string, error) {
	key := "freezer"
	if cgroups.IsCgroup2UnifiedMode() {
		key = ""
	}
	if p := st.CgroupPaths[key]; p != "" {
		return p, nil
	}
	return "", errors.New("checkpoint: the container is paused but has no freezer cgroup")
}

// dump has CRIU dump the container; with freeze, from that frozen
// cgroup; with copyTmpfs, its small tmpfs mounts are copied by the
// runtime (tmpfs.go).
func dump(c *cmdline, config *configs.Config, st *libcontainer.State, imageDir *os.File, images, freeze string, copyTmpfs bool) error {
	opts, closeWork, err := dumpOpts(c, config, st, imageDir, images, freeze)
	if err != nil {
		return err
	}
	defer closeWork()
	fds, err := json.Marshal(st.ExternalDescriptors)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(images, descriptorsFile), fds, 0o600); err != nil {
		return err
	}
	nfy := &tmpfsNotify{pid: st.InitProcessPid, images: images}
	if copyTmpfs {
		external := map[string]bool{}
		for _, m := range opts.ExtMnt {
			external[m.GetKey()] = true
		}
		if nfy.mounts, err = smallTmpfs(st.InitProcessPid, external); err != nil {
			return fmt.Errorf("checkpoint: the container's tmpfs mounts: %w", err)
		}
		for _, m := range nfy.mounts {
			for _, p := range m.Mountpoints {
				opts.ExtMnt = append(opts.ExtMnt, &criurpc.ExtMountMap{Key: proto.String(p), Val: proto.String(p)})
			}
		}
	}
	cr := criu.MakeCriu()
	if err := cr.Dump(opts, nfy); err != nil {
		return fmt.Errorf("criu dump: %w%s", oneLine{err}, CriuLogErrors(filepath.Join(criuWorkDir(c, images), "dump.log")))
	}
	return nil
}

// oneLine is an error said on one line: CRIU's messages end in a newline,
// and runc-v2 keeps only the first line of a checkpoint's error.
type oneLine struct{ error }

func (e oneLine) Error() string { return strings.Join(strings.Fields(e.error.Error()), " ") }
func (e oneLine) Unwrap() error { return e.error }

// criuWorkDir is where CRIU writes its log: the work directory the
// command names, else the images'.
func criuWorkDir(c *cmdline, images string) string {
	if w := c.str("work-path"); w != "" {
		return w
	}
	return images
}

// emptyDir removes what is in dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// checkpointable is the container to checkpoint and its state, if it
// runs or is paused, and whether it is paused.
func checkpointable(c *cmdline) (*libcontainer.Container, *libcontainer.State, bool, error) {
	container, err := getContainer(c)
	if err != nil {
		return nil, nil, false, err
	}
	status, err := container.Status()
	if err != nil {
		return nil, nil, false, err
	}
	if status != libcontainer.Running && status != libcontainer.Paused {
		return nil, nil, false, fmt.Errorf("container cannot be checkpointed in %s state", status)
	}
	st, err := container.State()
	if err != nil {
		return nil, nil, false, err
	}
	return container, st, status == libcontainer.Paused, nil
}

// dumpOpts is CRIU's dump of the container of config and state st into
// imageDir (the directory images), from the frozen cgroup freeze if there
// is one: the options the command gives, its work directory (closeWork
// closes it once dumped), its external namespaces and mounts, and for a
// memory fork its cgroups left alone if they are flat.
func dumpOpts(c *cmdline, config *configs.Config, st *libcontainer.State, imageDir *os.File, images, freeze string) (_ *criurpc.CriuOpts, closeWork func(), retErr error) {
	closeWork = func() {}
	defer func() {
		if retErr != nil {
			closeWork()
		}
	}()
	opts := &criurpc.CriuOpts{
		ImagesDirFd:     proto.Int32(int32(imageDir.Fd())),
		LogLevel:        proto.Int32(4),
		LogFile:         proto.String("dump.log"),
		Root:            proto.String(config.Rootfs),
		ManageCgroups:   proto.Bool(true),
		Pid:             proto.Int32(int32(st.InitProcessPid)),
		LeaveRunning:    proto.Bool(c.bool("leave-running")),
		ShellJob:        proto.Bool(c.bool("shell-job")),
		TcpEstablished:  proto.Bool(c.bool("tcp-established")),
		ExtUnixSk:       proto.Bool(c.bool("ext-unix-sk")),
		FileLocks:       proto.Bool(c.bool("file-locks")),
		OrphanPtsMaster: proto.Bool(true),
	}
	if !c.bool("tcp-established") {
		// No connection is dumped, so none needs the network locked
		// (with iptables, in a namespace the branches share).
		opts.NetworkLock = criurpc.CriuNetworkLockMethod_SKIP.Enum()
	}
	if w := c.str("work-path"); w != "" {
		if err := os.MkdirAll(w, 0o700); err != nil {
			return nil, closeWork, err
		}
		workDir, err := os.Open(w)
		if err != nil {
			return nil, closeWork, err
		}
		closeWork = func() { workDir.Close() }
		opts.WorkDirFd = proto.Int32(int32(workDir.Fd()))
	}
	if err := addExternalNamespaces(c, opts, config, st.InitProcessPid); err != nil {
		return nil, closeWork, err
	}
	// Without a frozen cgroup, CRIU stops the processes with ptrace alone:
	// its freezer path polls the freezer every 100ms, which a running
	// tree pays in full; a tree frozen already it does not.
	if freeze != "" {
		opts.FreezeCgroup = proto.String(freeze)
	}
	if err := addDumpMounts(opts, config, st.InitProcessPid); err != nil {
		return nil, closeWork, err
	}
	if config.Namespaces.Contains(configs.NEWUSER) {
		if err := externalSysfs(opts, st.InitProcessPid, images); err != nil {
			return nil, closeWork, fmt.Errorf("checkpoint: the container's sysfs mounts: %w", err)
		}
	}
	if c.bool(MemoryForkFlag) {
		opts.GhostLimit = proto.Uint32(GhostLimit)
		// A lock held (flock, fcntl: SQLite's, a pidfile's) fails a
		// dump without it; each copy takes it again on its own copy of
		// the file. Marked for the restore, which must ask for it too.
		opts.FileLocks = proto.Bool(true)
		if err := os.WriteFile(filepath.Join(images, fileLocksDumped), nil, 0o600); err != nil {
			return nil, closeWork, err
		}
	}
	if c.bool(MemoryForkFlag) && cgroupsFlat(st.InitProcessPid) {
		opts.ManageCgroups = proto.Bool(false)
		if err := os.WriteFile(filepath.Join(images, cgroupsIgnored), nil, 0o600); err != nil {
			return nil, closeWork, err
		}
	}
	return opts, closeWork, nil
}

// GhostLimit is the largest deleted file a memory fork's image carries
// (CRIU's ghost files, copied into the image and out again into each
// branch): CRIU's default, 1 MiB, refused a Python process holding a
// tempfile.TemporaryFile of a few MiB. The shim refuses a larger one
// before the dump, and counts those it carries in the image's room.
// containerd's checkpoints keep CRIU's default, as runc's do.
const GhostLimit = 64 << 20

// fileLocksDumped, in an image, marks a dump that holds the processes'
// file locks, which its restore must then ask CRIU to take again.
const fileLocksDumped = "file-locks-dumped"

// MemoryForkFlag, a flag of checkpoint, says that the image is a memory
// fork's, for this runtime's restores only, each of which joins the network
// namespace it is given: the init's network namespace is external whoever
// made it, the small tmpfs mounts are copied by the runtime (tmpfs.go) and
// a flat tree's cgroups left alone (cgroupmode.go), which save the fork
// time. Without it the image is runc's, as containerd's checkpoint of a
// task expects and runc's restore reads (a Kubernetes checkpoint archive
// may be restored on a node of either): a namespace is external where the
// container joined it by its path (a pod's), and otherwise dumped, and made
// again by the restore.
const MemoryForkFlag = "memory-fork"

// addExternalNamespaces marks the namespaces of the init pid that the
// image does not hold, under the keys libcontainer's Restore hands back.
func addExternalNamespaces(c *cmdline, opts *criurpc.CriuOpts, config *configs.Config, pid int) error {
	external := func(t configs.NamespaceType, key string) error {
		var ns unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, configs.NsName(t)), &ns); err != nil {
			return fmt.Errorf("checkpoint: %s namespace of the init: %w", configs.NsName(t), err)
		}
		opts.External = append(opts.External, fmt.Sprintf("%s[%d]:%s", configs.NsName(t), ns.Ino, key))
		return nil
	}
	if c.bool(MemoryForkFlag) {
		return external(configs.NEWNET, ExtNetNSKey)
	}
	if config.Namespaces.PathOf(configs.NEWNET) != "" {
		if err := external(configs.NEWNET, ExtNetNSKey); err != nil {
			return err
		}
	}
	if config.Namespaces.PathOf(configs.NEWPID) != "" {
		return external(configs.NEWPID, extPidNSKey)
	}
	return nil
}

// extPidNSKey is libcontainer's criuNsToKey(NEWPID).
const extPidNSKey = "extRootPidNS"

// addDumpMounts marks the mounts CRIU cannot dump as external, under the
// keys libcontainer's Restore maps back: bind mounts and device nodes by
// their destination, a v1 cgroup mount's binds, masked files (/dev/null).
func addDumpMounts(opts *criurpc.CriuOpts, config *configs.Config, pid int) error {
	add := func(dest string) error {
		d := strings.TrimPrefix(dest, config.Rootfs)
		if j, err := securejoin.SecureJoin(config.Rootfs, d); err == nil {
			d = j[len(config.Rootfs):]
		}
		if d == "" || strings.Contains(d, "]:") {
			return fmt.Errorf("criu: invalid external mount destination %q", d)
		}
		opts.ExtMnt = append(opts.ExtMnt, &criurpc.ExtMountMap{Key: proto.String(d), Val: proto.String(d)})
		return nil
	}
	cgroupns := config.Namespaces.Contains(configs.NEWCGROUP)
	for _, m := range config.Mounts {
		switch m.Device {
		case "bind":
			if err := add(m.Destination); err != nil {
				return err
			}
		case "cgroup":
			if cgroups.IsCgroup2UnifiedMode() || cgroupns {
				continue
			}
			mounts, err := cgroups.GetCgroupMounts(false)
			if err != nil {
				return err
			}
			for _, mm := range mounts {
				if err := add(filepath.Join(m.Destination, filepath.Base(mm.Mountpoint))); err != nil {
					return err
				}
			}
		}
	}
	for _, p := range config.MaskPaths {
		fi, err := os.Stat(fmt.Sprintf("/proc/%d/root/%s", pid, p))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return err
		}
		if !fi.IsDir() {
			opts.ExtMnt = append(opts.ExtMnt, &criurpc.ExtMountMap{Key: proto.String(p), Val: proto.String("/dev/null")})
		}
	}
	for _, d := range config.Devices {
		if d.Path != "" {
			if err := add(d.Path); err != nil {
				return err
			}
		}
	}
	return nil
}

// restore is runc restore: a container created from the bundle whose
// processes are restored from --image-path instead of started.
func restore(c *cmdline) error {
	prepareCriu()
	images := c.str("image-path")
	if images == "" {
		return errors.New("restore: --image-path is required")
	}
	undo := func() {}
	defer func() { undo() }()
	var keptHooks *specs.Hooks
	container, spec, err := bundleContainer(c, func(spec *specs.Spec) error {
		if bundle, err := os.Getwd(); err == nil {
			if netns := keptNetNS(bundle); netns != "" {
				keptHooks = joinKeptNetNS(spec, netns) // keptnet.go
			}
		}
		work := c.str("work-path")
		if work == "" {
			work = "." // the bundle
		}
		work, err := filepath.Abs(work)
		if err != nil {
			return err
		}
		undoCopies, err := tmpfsCopies(images, work, spec)
		undo = undoCopies
		if err != nil {
			return err
		}
		if err := resolveBindSources(spec); err != nil { // binds_restore.go
			return err
		}
		undoBinds, err := reachableBinds(work, spec)
		undo = func() { undoBinds(); undoCopies() }
		return err
	})
	if err != nil {
		return err
	}
	opts := &libcontainer.CriuOpts{
		ImagesDirectory:         images,
		WorkDirectory:           c.str("work-path"),
		TcpEstablished:          c.bool("tcp-established"),
		ExternalUnixConnections: c.bool("ext-unix-sk"),
		ShellJob:                c.bool("shell-job"),
		FileLocks:               c.bool("file-locks"),
		StatusFd:                -1,
	}
	if _, err := os.Stat(filepath.Join(images, fileLocksDumped)); err == nil {
		opts.FileLocks = true
	}
	if _, err := os.Stat(filepath.Join(images, cgroupsIgnored)); err == nil {
		opts.ManageCgroupsMode = "ignore" // cgroupmode.go
	}
	r := &runner{
		container:     container,
		shouldDestroy: true,
		consoleSocket: c.str("console-socket"),
		pidFile:       c.str("pid-file"),
		init:          true,
		subreaper:     !c.bool("no-subreaper"),
		restore:       opts,
	}
	if err := r.run(spec.Process); err != nil {
		return fmt.Errorf("%w%s", err, CriuLogErrors(filepath.Join(criuWorkDir(c, images), "restore.log")))
	}
	// The processes run: a failure here costs the poststop hooks of the
	// container's end, not the restore.
	if err := recordHooks(c, spec, keptHooks); err != nil {
		logrus.WithError(err).Warn("the restored container's hooks were not recorded: its end will run none")
	}
	return nil
}
