// brinit: the init of a branch, run by the shim in a new PID namespace
// (and whatever others the branch needs; its mount namespace it makes
// itself: own_mntns). It runs before
// the Go runtime starts (a constructor) and never returns to it, so that a
// branch starts without a run of the Go runtime: see init.go.
//
// Protocol, on a SOCK_SEQPACKET socket at fd 3 (the shim's end holds the
// other side):
//   shim -> init  'C' config: NUL-terminated strings, an op name and its
//                 arguments, executed in order (see run_op); ends with the
//                 branch ready, or 'F' and an exit.
//   init -> shim  'R' root built, or 'F' "message".
//   shim -> init  'G' go: the init is in all of the branch's cgroups now
//                 (it was started in its pids and memory cgroups, so that
//                 their limits hold from its first instant; the shim moves
//                 it into the other v1 hierarchies while the root is built).
//                 A config with the op 'joined' (an init started ahead,
//                 long in its cgroups) has neither 'R' nor 'G'.
// An init started ahead of a fork may first get
//   shim -> init  'P' early set-up: ops only (joins, filesystems made in
//                 slots); then init -> shim 'p', or 'F' "message".
//   init -> shim  'O' pid-of-command (0 for none), or 'F' "message".
//   shim -> init  'E' process: the same encoding (see proc_key), with
//                 SCM_RIGHTS stdin, stdout, stderr, reply socket (or, for a
//                 terminal, just the reply socket).
//   init -> shim  'S' pid-in-branch (decimal), in the order of the 'E's.
//   init -> shim  'X' pid status (decimal; a wait(2) status) for every
//                 process started with 'E' when it ends.
// Each started process writes on its reply socket: 'P' with SCM_CREDENTIALS
// (the shim reads its host pid from them), 'T' with the terminal's master
// for a terminal, then either nothing (exec succeeded: the socket closes on
// exec) or 'E' "message" if the exec failed.
//
// A command given at fork ('run' in the config) is the branch's main
// process: when it exits, this init exits with its status, which ends every
// process of the branch (the kernel kills a PID namespace with its init).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define CTL 3
#define MSGMAX (256 * 1024)
#define MAXARGS 4096

static int rootfd = -1;
static int pivoted;
static int want_cgroupns;

// The sandbox's seccomp filter, as runc would load it (compiled by the
// shim with runc's code), installed in every process this init starts.
static struct sock_filter seccomp_prog[BPF_MAXINSNS];
static unsigned short seccomp_len;
static unsigned long seccomp_flags;

// fail reports why the branch could not be set up and exits.
static void fail(const char *fmt, ...) {
	char msg[1100];
	va_list ap;
	va_start(ap, fmt);
	msg[0] = 'F';
	vsnprintf(msg + 1, sizeof(msg) - 1, fmt, ap);
	va_end(ap);
	send(CTL, msg, strlen(msg), MSG_NOSIGNAL);
	_exit(1);
}

// proc is a process to start: the branch's command or an exec.
struct proc {
	char *args[MAXARGS];
	int nargs;
	char *env[MAXARGS];
	int nenv;
	char *cwd;
	uid_t uid;
	gid_t gid;
	gid_t groups[256];
	int ngroups;
	uint64_t capb, cape, capp, capi, capa;
	int nnp, term, umask_set;
	mode_t umask;
	int oom_set, oom;
	struct {
		int type;
		struct rlimit lim;
	} rlimits[32];
	int nrlimits;
	int sched_set;
	struct sched_attr_v1 {
		uint32_t size, policy;
		uint64_t flags;
		int32_t nice;
		uint32_t priority;
		uint64_t runtime, deadline, period;
		uint32_t util_min, util_max;
	} sched;
	int ioprio_set, ioprio;
	const char *affinity; // hex of a CPU mask, "" for every CPU, NULL to leave
	const char *apparmor; // the AppArmor profile to change to at exec
};

static int openat2_in_root(int dirfd, const char *path, int flags) {
	struct open_how how = {.flags = flags | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
	while (*path == '/')
		path++;
	if (*path == 0)
		path = ".";
	return syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
}

// resolve opens path inside the root (symlinks resolved as if the root
// were /, never out of it) as O_PATH, creating what is missing: kind 0
// creates nothing, 1 a directory, 2 a regular file.
static int resolve(const char *path, int kind) {
	int fd = openat2_in_root(rootfd, path, O_PATH);
	if (fd >= 0 || errno != ENOENT || kind == 0)
		return fd;
	char buf[4096];
	if (strlen(path) >= sizeof(buf)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(buf, path);
	int parent = openat2_in_root(rootfd, "/", O_PATH | O_DIRECTORY);
	if (parent < 0)
		return -1;
	char *p = buf;
	for (;;) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		char *end = p + strcspn(p, "/");
		char saved = *end;
		int last = 1;
		for (char *q = end; *q; q++)
			if (*q != '/')
				last = 0;
		*end = 0;
		// the prefix up to this component, resolved from the root
		fd = openat2_in_root(rootfd, buf, O_PATH);
		if (fd < 0 && errno == ENOENT) {
			if (last && kind == 2) {
				int f = openat(parent, p, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
				if (f >= 0)
					close(f);
				else if (errno != EEXIST) {
					close(parent);
					return -1;
				}
			} else if (mkdirat(parent, p, 0755) < 0 && errno != EEXIST) {
				close(parent);
				return -1;
			}
			fd = openat2_in_root(rootfd, buf, O_PATH);
		}
		close(parent);
		if (fd < 0)
			return -1;
		parent = fd;
		*end = saved;
		if (!saved)
			break;
		p = end + 1;
	}
	return parent;
}

static const char *fdpath(int fd) {
	static char b[64];
	snprintf(b, sizeof(b), "/proc/self/fd/%d", fd);
	return b;
}

static unsigned long num(const char *s) { return strtoul(s, NULL, 0); }

// The ops of a config. Each takes its arguments from args.
static void op_mount(char **a) {
	// mount SRC DST FSTYPE FLAGS DATA
	int fd = resolve(a[1], 1);
	if (fd < 0)
		fail("mount %s on %s: resolve target: %s", a[2], a[1], strerror(errno));
	unsigned long flags = num(a[3]);
	if (mount(a[0], fdpath(fd), a[2], flags, a[4][0] ? a[4] : NULL) < 0)
		fail("mount %s (%s) on %s: %s", a[0], a[2], a[1], strerror(errno));
	close(fd);
}

static void remount_at(const char *dst, unsigned long flags) {
	int fd = resolve(dst, 0);
	if (fd < 0)
		fail("remount %s: %s", dst, strerror(errno));
	if (mount(NULL, fdpath(fd), NULL, flags | MS_REMOUNT, NULL) < 0)
		fail("remount %s (flags %#lx): %s", dst, flags, strerror(errno));
	close(fd);
}

static void op_bind(char **a) {
	// bind SRC DST FLAGS REC: FLAGS (read-only and the like) are applied
	// by a remount of the bind, as mount(2) ignores them on the bind.
	struct stat st;
	if (stat(a[0], &st) < 0)
		fail("bind %s: %s", a[0], strerror(errno));
	int fd = resolve(a[1], S_ISDIR(st.st_mode) ? 1 : 2);
	if (fd < 0)
		fail("bind %s on %s: resolve target: %s", a[0], a[1], strerror(errno));
	unsigned long flags = num(a[2]);
	if (mount(a[0], fdpath(fd), NULL, MS_BIND | (num(a[3]) ? MS_REC : 0), NULL) < 0)
		fail("bind %s on %s: %s", a[0], a[1], strerror(errno));
	close(fd);
	if (flags & ~(MS_BIND | MS_REC))
		remount_at(a[1], MS_BIND | (flags & ~MS_REC));
}

static void op_propagate(char **a) {
	// propagate DST FLAGS: a mount's propagation (private or slave,
	// recursive or not), set after it is made, as runc's mountPropagate.
	int fd = resolve(a[0], 0);
	if (fd < 0)
		fail("propagation of %s: %s", a[0], strerror(errno));
	if (mount(NULL, fdpath(fd), NULL, num(a[1]), NULL) < 0)
		fail("propagation of %s (%#lx): %s", a[0], num(a[1]), strerror(errno));
	close(fd);
}

// open_parent opens the directory that is to hold path inside the root
// (made if missing) as a real directory descriptor, which mknodat and
// symlinkat need, and points *name at path's last element (in buf).
static int open_parent(const char *op, const char *path, char *buf, size_t size, const char **name) {
	snprintf(buf, size, "%s", path);
	char *slash = strrchr(buf, '/');
	int dir;
	if (slash) {
		*slash = 0;
		*name = slash + 1;
		dir = resolve(buf[0] ? buf : "/", 1);
	} else {
		*name = buf;
		dir = resolve("/", 0);
	}
	if (dir < 0)
		fail("%s %s: %s", op, path, strerror(errno));
	int d = openat(dir, ".", O_DIRECTORY | O_CLOEXEC);
	close(dir);
	if (d < 0)
		fail("%s %s: open directory: %s", op, path, strerror(errno));
	return d;
}

// make_node makes the device node name in dir from MODE MAJOR MINOR UID
// GID in a, with the mode the spec gives, not the umask's share of it
// (runc makes devices with umask 0): /dev/null must stay writable for a
// user. An existing node is left (exist_ok) or is an error; errors name
// the node as shown.
static void make_node(int dir, const char *name, char **a, int exist_ok, const char *shown) {
	if (mknodat(dir, name, num(a[0]), makedev(num(a[1]), num(a[2]))) < 0 && !(exist_ok && errno == EEXIST))
		fail("mknod %s: %s", shown, strerror(errno));
	if (fchmodat(dir, name, num(a[0]) & 07777, 0) < 0)
		fail("chmod %s: %s", shown, strerror(errno));
	if (fchownat(dir, name, num(a[3]), num(a[4]), AT_SYMLINK_NOFOLLOW) < 0)
		fail("chown %s: %s", shown, strerror(errno));
}

// make_link makes name in dir a symlink to target, replacing what is there.
static void make_link(int dir, const char *target, const char *name, const char *shown) {
	unlinkat(dir, name, 0);
	if (symlinkat(target, dir, name) < 0)
		fail("symlink %s: %s", shown, strerror(errno));
}

static void op_mknod(char **a) {
	// mknod DST MODE MAJOR MINOR UID GID
	int fd = resolve(a[0], 0);
	if (fd >= 0) {
		close(fd);
		return; // there already
	}
	char buf[4096];
	const char *name;
	int d = open_parent("mknod", a[0], buf, sizeof(buf), &name);
	make_node(d, name, a + 1, 0, a[0]);
	close(d);
}

static void op_symlink(char **a) {
	// symlink TARGET DST (an existing DST is replaced)
	char buf[4096];
	const char *name;
	int d = open_parent("symlink", a[1], buf, sizeof(buf), &name);
	make_link(d, a[0], name, a[1]);
	close(d);
}

static void op_mask(char **a) {
	// mask PATH: /dev/null over a file, an empty read-only tmpfs over a
	// directory; a path that does not exist needs no mask.
	int fd = resolve(a[0], 0);
	if (fd < 0) {
		if (errno == ENOENT)
			return;
		fail("mask %s: %s", a[0], strerror(errno));
	}
	struct stat st;
	if (fstat(fd, &st) < 0)
		fail("mask %s: %s", a[0], strerror(errno));
	int r;
	if (S_ISDIR(st.st_mode))
		r = mount("tmpfs", fdpath(fd), "tmpfs", MS_RDONLY, "size=0");
	else {
		int null = resolve("/dev/null", 0);
		if (null < 0)
			fail("mask %s: /dev/null: %s", a[0], strerror(errno));
		char src[64];
		snprintf(src, sizeof(src), "/proc/self/fd/%d", null);
		r = mount(src, fdpath(fd), NULL, MS_BIND, NULL);
		close(null);
	}
	if (r < 0)
		fail("mask %s: %s", a[0], strerror(errno));
	close(fd);
}

static void op_readonly(char **a) {
	// readonly PATH: bind over itself, read-only.
	int fd = resolve(a[0], 0);
	if (fd < 0) {
		if (errno == ENOENT)
			return;
		fail("read-only %s: %s", a[0], strerror(errno));
	}
	if (mount(fdpath(fd), fdpath(fd), NULL, MS_BIND | MS_REC, NULL) < 0)
		fail("read-only %s: bind: %s", a[0], strerror(errno));
	close(fd);
	remount_at(a[0], MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
}

static void op_setns(char **a) {
	// setns PATH: join a namespace (before the root changes)
	int fd = open(a[0], O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, 0) < 0)
		fail("join namespace %s: %s", a[0], strerror(errno));
	close(fd);
}

static int cfg_fds[8], cfg_nfds;

// The init's own mount namespace, a copy of the node's mounts. It is not
// made at the clone (see CloneFlags): an init started ahead of a fork
// makes it when it is prepared (op mntns, sent by the shim) where the
// node's root mount is shared (systemd as PID 1 makes it so), since the
// copies of shared mounts are peers of the node's, which an unmount on
// the node reaches, and the fork then does not wait for the copy (about
// 1.5 ms with 1,000 mounts); elsewhere when it builds the root (op_root),
// as a copy made early would hold every mount the node had then for as
// long as the init waits. A cold init makes it in op_root too.
static int mntns_made;

static void own_mntns(void) {
	if (mntns_made)
		return;
	if (unshare(CLONE_NEWNS) < 0)
		fail("new mount namespace: %s", strerror(errno));
	mntns_made = 1;
}

static void op_mntns(char **a) {
	// mntns: the init's mount namespace, now (own_mntns).
	(void)a;
	own_mntns();
}

static void op_root(char **a) {
	// root PATH FLAGS: the branch's rootfs, whose mount (a clone of the
	// shim's) is the config's first descriptor, attached at PATH: this
	// init may have been started before the shim mounted it. Its mount
	// namespace is made by now (own_mntns), and its mounts made slaves
	// of the node's (or private: FLAGS, the spec's rootfs propagation,
	// never shared), as runc's prepareRoot makes them, first.
	own_mntns();
	unsigned long prop = num(a[1]);
	if (mount(NULL, "/", NULL, prop, NULL) < 0)
		fail("set the propagation of the node's mounts (%#lx): %s", prop, strerror(errno));
	if (cfg_nfds < 1)
		fail("root: no rootfs mount");
	if (syscall(SYS_move_mount, cfg_fds[0], "", AT_FDCWD, a[0], 0x4 /* MOVE_MOUNT_F_EMPTY_PATH */) < 0)
		fail("attach rootfs at %s: %s", a[0], strerror(errno));
	close(cfg_fds[0]);
	cfg_fds[0] = -1;
	// The attached tree is a clone of the shim's mount, and keeps its
	// shared propagation where the host's mounts are shared (systemd as
	// PID 1 makes them so): pivot_root refuses a shared new root (EINVAL).
	// A slave of it, as runc's bind of the rootfs on itself below a
	// slave root is (private if the spec asked so).
	if (mount(NULL, a[0], NULL, MS_REC | (prop & MS_PRIVATE ? MS_PRIVATE : MS_SLAVE), NULL) < 0)
		fail("make rootfs mounts slaves: %s", strerror(errno));
	rootfd = open(a[0], O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		fail("open rootfs %s: %s", a[0], strerror(errno));
}

static void op_pivot(char **a) {
	(void)a;
	if (fchdir(rootfd) < 0)
		fail("enter rootfs: %s", strerror(errno));
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		fail("pivot_root: %s", strerror(errno));
	if (umount2(".", MNT_DETACH) < 0)
		fail("detach the old root: %s", strerror(errno));
	if (chdir("/") < 0)
		fail("chdir /: %s", strerror(errno));
	close(rootfd);
	rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		fail("open /: %s", strerror(errno));
	pivoted = 1;
}

static void op_write(char **a) {
	// write PATH VALUE (sysctls, after the pivot)
	int fd = open(a[0], O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 || write(fd, a[1], strlen(a[1])) < 0)
		fail("write %s: %s", a[0], strerror(errno));
	close(fd);
}

static void op_hostname(char **a) {
	if (sethostname(a[0], strlen(a[0])) < 0)
		fail("set hostname: %s", strerror(errno));
}

static void op_domainname(char **a) {
	if (setdomainname(a[0], strlen(a[0])) < 0)
		fail("set domain name: %s", strerror(errno));
}

static void op_lo(char **a) {
	(void)a;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct ifreq ifr = {0};
	strcpy(ifr.ifr_name, "lo");
	if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		fail("loopback: %s", strerror(errno));
	ifr.ifr_flags |= IFF_UP;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		fail("bring loopback up: %s", strerror(errno));
	close(s);
}

static void op_cgroupns(char **a) {
	(void)a;
	want_cgroupns = 1; // once in the branch's cgroup
}

// Slots hold filesystems made before the fork (fsmount), not yet attached
// anywhere: an init started ahead makes them in its early set-up ('P'),
// the config attaches them (see the shim's splitPrep).
#define NSLOTS 64
static int slots[NSLOTS];

static int slot_at(const char *s) {
	unsigned long i = num(s);
	if (i >= NSLOTS)
		fail("slot %s out of range", s);
	return (int)i;
}

// mount_attrs maps mount(2) flags to fsmount(2) attributes.
static unsigned int mount_attrs(unsigned long f) {
	unsigned int a = 0;
	if (f & MS_RDONLY)
		a |= 0x1; // MOUNT_ATTR_RDONLY
	if (f & MS_NOSUID)
		a |= 0x2; // MOUNT_ATTR_NOSUID
	if (f & MS_NODEV)
		a |= 0x4; // MOUNT_ATTR_NODEV
	if (f & MS_NOEXEC)
		a |= 0x8; // MOUNT_ATTR_NOEXEC
	if (f & MS_NOATIME)
		a |= 0x10; // MOUNT_ATTR_NOATIME
	else if (f & MS_STRICTATIME)
		a |= 0x20; // MOUNT_ATTR_STRICTATIME
	if (f & MS_NODIRATIME)
		a |= 0x80; // MOUNT_ATTR_NODIRATIME
	return a;
}

static void op_fsmount(char **a) {
	// fsmount SLOT SRC FSTYPE FLAGS DATA: a new filesystem, as mount SRC
	// DST FSTYPE FLAGS DATA would make it, held detached in SLOT.
	int i = slot_at(a[0]);
	int fs = syscall(SYS_fsopen, a[2], 0x1 /* FSOPEN_CLOEXEC */);
	if (fs < 0)
		fail("make %s: fsopen: %s", a[2], strerror(errno));
	if (syscall(SYS_fsconfig, fs, 1 /* FSCONFIG_SET_STRING */, "source", a[1], 0) < 0)
		fail("make %s: source %s: %s", a[2], a[1], strerror(errno));
	char data[4096];
	if (strlen(a[4]) >= sizeof(data))
		fail("make %s: options too long", a[2]);
	strcpy(data, a[4]);
	for (char *save = NULL, *kv = strtok_r(data, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *v = strchr(kv, '=');
		int r;
		if (v) {
			*v++ = 0;
			r = syscall(SYS_fsconfig, fs, 1 /* FSCONFIG_SET_STRING */, kv, v, 0);
		} else
			r = syscall(SYS_fsconfig, fs, 0 /* FSCONFIG_SET_FLAG */, kv, NULL, 0);
		if (r < 0)
			fail("make %s: option %s: %s", a[2], kv, strerror(errno));
	}
	// Read-only, as mount(2) makes it: the superblock and the mount.
	if ((num(a[3]) & MS_RDONLY) && syscall(SYS_fsconfig, fs, 0 /* FSCONFIG_SET_FLAG */, "ro", NULL, 0) < 0)
		fail("make %s: ro: %s", a[2], strerror(errno));
	if (syscall(SYS_fsconfig, fs, 6 /* FSCONFIG_CMD_CREATE */, NULL, NULL, 0) < 0)
		fail("make %s: %s", a[2], strerror(errno));
	int m = syscall(SYS_fsmount, fs, 0x1 /* FSMOUNT_CLOEXEC */, mount_attrs(num(a[3])));
	if (m < 0)
		fail("make %s: fsmount: %s", a[2], strerror(errno));
	close(fs);
	if (slots[i] >= 0)
		close(slots[i]);
	slots[i] = m;
}

static void op_attach(char **a) {
	// attach SLOT DST: the slot's mount on DST inside the root.
	int i = slot_at(a[0]);
	if (slots[i] < 0)
		fail("attach %s: empty slot %s", a[1], a[0]);
	int fd = resolve(a[1], 1);
	if (fd < 0)
		fail("attach on %s: resolve target: %s", a[1], strerror(errno));
	if (syscall(SYS_move_mount, slots[i], "", fd, "", 0x4 | 0x40 /* MOVE_MOUNT_F_EMPTY_PATH | T_EMPTY_PATH */) < 0)
		fail("attach on %s: %s", a[1], strerror(errno));
	close(fd);
	close(slots[i]);
	slots[i] = -1;
}

static void op_mknodat(char **a) {
	// mknodat SLOT NAME MODE MAJOR MINOR UID GID: a node in the root of
	// the slot's filesystem, as mknod would make it.
	int i = slot_at(a[0]);
	if (slots[i] < 0)
		fail("mknod %s: empty slot %s", a[1], a[0]);
	make_node(slots[i], a[1], a + 2, 1, a[1]);
}

static void op_symlinkat(char **a) {
	// symlinkat SLOT TARGET NAME
	int i = slot_at(a[0]);
	if (slots[i] < 0)
		fail("symlink %s: empty slot %s", a[2], a[0]);
	make_link(slots[i], a[1], a[2], a[2]);
}

static int joined;

static void op_joined(char **a) {
	(void)a;
	joined = 1; // in every cgroup already: no 'R' and 'G' round trip
}

static void op_rootro(char **a) {
	(void)a;
	if (mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0)
		fail("make the rootfs read-only: %s", strerror(errno));
}

static void op_remount(char **a) { remount_at(a[0], num(a[1])); }

static void op_timens(char **a) {
	// timens OFFSETS: a new time namespace for the processes this init
	// starts (unshare puts its children there, not itself), with the
	// clocks' offsets, which can only be set before anything enters it.
	if (unshare(CLONE_NEWTIME) < 0)
		fail("new time namespace: %s", strerror(errno));
	int fd = open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fail("open timens_offsets: %s", strerror(errno));
	if (a[0][0] && write(fd, a[0], strlen(a[0])) < 0)
		fail("set the time namespace's offsets (%s): %s", a[0], strerror(errno));
	close(fd);
}

static int unhex(char c) {
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

static void op_seccomp(char **a) {
	// seccomp FLAGS COUNT: the program, COUNT struct sock_filter in host
	// byte order, is the file of the config's last descriptor (a sealed
	// memfd), which is taken off the list.
	unsigned long count = num(a[1]);
	if (count == 0 || count > BPF_MAXINSNS)
		fail("seccomp: a program of %lu instructions", count);
	if (cfg_nfds < 2)
		fail("seccomp: no program descriptor");
	int fd = cfg_fds[--cfg_nfds];
	size_t want = count * sizeof(struct sock_filter);
	ssize_t got = pread(fd, seccomp_prog, want, 0);
	if (got != (ssize_t)want)
		fail("seccomp: read the program: %zd of %zu bytes: %s", got, want, got < 0 ? strerror(errno) : "short");
	close(fd);
	seccomp_len = (unsigned short)count;
	seccomp_flags = num(a[0]);
}

// The command's output: the init reads the pipe the command writes to
// and appends it to the branch's log, a host file the shim opened, so
// that copying it is the branch's own cost (its cgroup's CPU) and the log
// stays bounded: once it holds 2*log_max bytes, its last log_max are
// moved to its start. What cannot be written (a full disk) is dropped;
// the command is never blocked by its log.
static int log_in = -1, log_out = -1;
static off_t log_size, log_max;
static char log_buf[64 * 1024];

static void op_log(char **a) {
	// log MAX: the pipe's read end and the log file are the config's last
	// two descriptors (before the seccomp program's, which its op takes
	// first).
	if (cfg_nfds < 3)
		fail("log: no descriptors");
	log_out = cfg_fds[--cfg_nfds];
	log_in = cfg_fds[--cfg_nfds];
	log_max = (off_t)num(a[0]);
	if (log_max < 4096 || log_max > ((off_t)1 << 40))
		fail("log: a bound of %s bytes", a[0]);
	// Read as it comes, between the control socket's requests (the
	// command's end of the pipe is its own description, left blocking).
	int fl = fcntl(log_in, F_GETFL);
	if (fl < 0 || fcntl(log_in, F_SETFL, fl | O_NONBLOCK) < 0)
		fail("log: %s", strerror(errno));
	struct stat st;
	if (fstat(log_out, &st) < 0 || !S_ISREG(st.st_mode))
		fail("log: not a file");
	log_size = st.st_size;
}

static int write_at(int fd, const char *b, size_t n, off_t off) {
	while (n > 0) {
		ssize_t w = pwrite(fd, b, n, off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w, n -= (size_t)w, off += w;
	}
	return 0;
}

// log_keep_end moves the log's last log_max bytes to its start.
static int log_keep_end(void) {
	off_t from = log_size - log_max, to = 0;
	while (to < log_max) {
		size_t want = sizeof(log_buf);
		if ((off_t)want > log_max - to)
			want = (size_t)(log_max - to);
		ssize_t n = pread(log_out, log_buf, want, from + to);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || write_at(log_out, log_buf, (size_t)n, to) < 0)
			return -1;
		to += n;
	}
	if (ftruncate(log_out, to) < 0)
		return -1;
	log_size = to;
	return 0;
}

// log_pump copies at most reads chunks of what the pipe holds into the
// log (a bound, so that a writer that never stops does not starve the
// control socket); it returns 0 once the pipe has no writer left and is
// empty.
static int log_pump(int reads) {
	while (reads-- > 0) {
		ssize_t n = read(log_in, log_buf, sizeof(log_buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EAGAIN;
		if (n == 0)
			return 0;
		if (log_out < 0)
			continue;
		if (write_at(log_out, log_buf, (size_t)n, log_size) < 0) {
			close(log_out);
			log_out = -1;
			continue;
		}
		log_size += n;
		if (log_size >= 2 * log_max && log_keep_end() < 0) {
			close(log_out);
			log_out = -1;
		}
	}
	return 1;
}

// exit_branch ends the branch with status, once what its command wrote
// before it exited is in the log (writers left, its children, die with
// this init: what they write meanwhile is bounded by the reads).
static void exit_branch(int status) {
	if (log_in >= 0)
		log_pump(1024);
	_exit(status);
}

struct op {
	const char *name;
	int nargs;
	void (*fn)(char **);
};

static const struct op ops[] = {
    {"mount", 5, op_mount},     {"bind", 4, op_bind},         {"mknod", 6, op_mknod},
    {"symlink", 2, op_symlink}, {"mask", 1, op_mask},         {"readonly", 1, op_readonly},
    {"setns", 1, op_setns},     {"root", 2, op_root},         {"pivot", 0, op_pivot},
    {"write", 2, op_write},     {"hostname", 1, op_hostname}, {"domainname", 1, op_domainname},
    {"lo", 0, op_lo},           {"cgroupns", 0, op_cgroupns},   {"rootro", 0, op_rootro},
    {"remount", 2, op_remount}, {"seccomp", 2, op_seccomp}, {"timens", 1, op_timens},
    {"joined", 0, op_joined},   {"fsmount", 5, op_fsmount},  {"attach", 2, op_attach},
    {"mknodat", 7, op_mknodat}, {"symlinkat", 3, op_symlinkat}, {"log", 1, op_log},
    {"propagate", 2, op_propagate}, {"mntns", 0, op_mntns},
};

// proc_key takes one key of a process description; it returns the number
// of arguments it used, or -1 if name is not a process key.
static int proc_key(struct proc *p, const char *name, char **a, int avail) {
#define NEED(n)                                                                                    \
	if (avail < (n))                                                                           \
		fail("%s: missing arguments", name);
	if (!strcmp(name, "arg")) {
		NEED(1);
		if (p->nargs >= MAXARGS - 1)
			fail("too many arguments");
		p->args[p->nargs++] = a[0];
		return 1;
	} else if (!strcmp(name, "env")) {
		NEED(1);
		if (p->nenv >= MAXARGS - 1)
			fail("too many environment variables");
		p->env[p->nenv++] = a[0];
		return 1;
	} else if (!strcmp(name, "cwd")) {
		NEED(1);
		p->cwd = a[0];
		return 1;
	} else if (!strcmp(name, "user")) {
		NEED(2);
		p->uid = num(a[0]);
		p->gid = num(a[1]);
		return 2;
	} else if (!strcmp(name, "group")) {
		NEED(1);
		if (p->ngroups < 256)
			p->groups[p->ngroups++] = num(a[0]);
		return 1;
	} else if (!strcmp(name, "caps")) {
		NEED(5);
		p->capb = strtoull(a[0], NULL, 0);
		p->cape = strtoull(a[1], NULL, 0);
		p->capp = strtoull(a[2], NULL, 0);
		p->capi = strtoull(a[3], NULL, 0);
		p->capa = strtoull(a[4], NULL, 0);
		return 5;
	} else if (!strcmp(name, "nnp")) {
		p->nnp = 1;
		return 0;
	} else if (!strcmp(name, "term")) {
		p->term = 1;
		return 0;
	} else if (!strcmp(name, "umask")) {
		NEED(1);
		p->umask_set = 1;
		p->umask = num(a[0]);
		return 1;
	} else if (!strcmp(name, "oom")) {
		NEED(1);
		p->oom_set = 1;
		p->oom = atoi(a[0]);
		return 1;
	} else if (!strcmp(name, "sched")) {
		NEED(7);
		p->sched_set = 1;
		p->sched = (struct sched_attr_v1){
		    .size = sizeof(p->sched),
		    .policy = num(a[0]),
		    .flags = strtoull(a[1], NULL, 0),
		    .nice = atoi(a[2]),
		    .priority = num(a[3]),
		    .runtime = strtoull(a[4], NULL, 0),
		    .deadline = strtoull(a[5], NULL, 0),
		    .period = strtoull(a[6], NULL, 0),
		};
		return 7;
	} else if (!strcmp(name, "ioprio")) {
		NEED(1);
		p->ioprio_set = 1;
		p->ioprio = atoi(a[0]);
		return 1;
	} else if (!strcmp(name, "apparmor")) {
		NEED(1);
		p->apparmor = a[0];
		return 1;
	} else if (!strcmp(name, "affinity")) {
		NEED(1);
		p->affinity = a[0];
		return 1;
	} else if (!strcmp(name, "rlimit")) {
		NEED(3);
		if (p->nrlimits < 32) {
			p->rlimits[p->nrlimits].type = num(a[0]);
			p->rlimits[p->nrlimits].lim.rlim_cur = strtoull(a[1], NULL, 0);
			p->rlimits[p->nrlimits].lim.rlim_max = strtoull(a[2], NULL, 0);
			p->nrlimits++;
		}
		return 3;
	}
	return -1;
#undef NEED
}

static void child_fail(int reply, const char *fmt, ...) {
	char msg[1100];
	va_list ap;
	va_start(ap, fmt);
	msg[0] = 'E';
	vsnprintf(msg + 1, sizeof(msg) - 1, fmt, ap);
	va_end(ap);
	send(reply, msg, strlen(msg), MSG_NOSIGNAL);
	_exit(127);
}

static int send_fd(int sock, char tag, int fd) {
	char c = tag;
	struct iovec iov = {.iov_base = &c, .iov_len = 1};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *c1 = CMSG_FIRSTHDR(&m);
	c1->cmsg_level = SOL_SOCKET;
	c1->cmsg_type = SCM_RIGHTS;
	c1->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c1), &fd, sizeof(int));
	return sendmsg(sock, &m, MSG_NOSIGNAL);
}

static int send_creds(int sock) {
	char c = 'P';
	struct iovec iov = {.iov_base = &c, .iov_len = 1};
	union {
		char buf[CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *c1 = CMSG_FIRSTHDR(&m);
	c1->cmsg_level = SOL_SOCKET;
	c1->cmsg_type = SCM_CREDENTIALS;
	c1->cmsg_len = CMSG_LEN(sizeof(struct ucred));
	struct ucred cr = {.pid = getpid(), .uid = getuid(), .gid = getgid()};
	memcpy(CMSG_DATA(c1), &cr, sizeof(cr));
	return sendmsg(sock, &m, MSG_NOSIGNAL);
}

static const char *getenv_in(struct proc *p, const char *key) {
	size_t n = strlen(key);
	for (int i = 0; i < p->nenv; i++)
		if (!strncmp(p->env[i], key, n) && p->env[i][n] == '=')
			return p->env[i] + n + 1;
	return NULL;
}

// set_affinity sets the CPUs this process may run on: mask (hex, host
// byte order), or every CPU for "" (the kernel keeps to the cgroup's
// cpuset), as runc resets what its processes would inherit.
static void set_affinity(int reply, const char *mask) {
	static unsigned char buf[64 * 1024 / 8];
	size_t n = strlen(mask) / 2;
	if (n == 0) {
		memset(buf, 0xff, sizeof(buf));
		n = sizeof(buf);
	} else {
		if (n > sizeof(buf))
			child_fail(reply, "cpu affinity: mask too long");
		for (size_t i = 0; i < n; i++) {
			int hi = unhex(mask[2 * i]), lo = unhex(mask[2 * i + 1]);
			if (hi < 0 || lo < 0)
				child_fail(reply, "cpu affinity: bad mask");
			buf[i] = (unsigned char)(hi << 4 | lo);
		}
	}
	// A failed reset leaves the init's affinity, as runc only warns then.
	if (syscall(SYS_sched_setaffinity, 0, n, buf) < 0 && mask[0])
		child_fail(reply, "set the cpu affinity: %s", strerror(errno));
}

// apparmor_on_exec has the next execve change to AppArmor profile name, as
// runc's apparmor.ApplyProfile (libapparmor's aa_change_onexec) does.
static void apparmor_on_exec(int reply, const char *name) {
	char v[1100];
	snprintf(v, sizeof(v), "exec %s", name);
	int fd = open("/proc/thread-self/attr/apparmor/exec", O_WRONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		fd = open("/proc/thread-self/attr/exec", O_WRONLY | O_CLOEXEC); // the old convention
	if (fd < 0 || write(fd, v, strlen(v)) < 0)
		child_fail(reply, "apparmor failed to apply profile %s: %s", name, strerror(errno));
	close(fd);
}

// install_seccomp loads the sandbox's filter into this process as runc's
// patchbpf does: prctl(2) when no flags are asked for, seccomp(2) with them.
static void install_seccomp(int reply) {
	struct sock_fprog prog = {.len = seccomp_len, .filter = seccomp_prog};
	long r;
	if (seccomp_flags == 0)
		r = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
	else
		r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, seccomp_flags, &prog);
	if (r < 0)
		child_fail(reply, "load the seccomp filter: %s", strerror(errno));
}

// exec_proc is the child's half of a start: it never returns.
static void exec_proc(struct proc *p, int fds[3], int reply) {
	sigset_t all;
	sigemptyset(&all);
	for (int s = 1; s < NSIG; s++)
		signal(s, SIG_DFL);
	sigprocmask(SIG_SETMASK, &all, NULL);
	if (setsid() < 0)
		child_fail(reply, "setsid: %s", strerror(errno));
	if (send_creds(reply) < 0)
		child_fail(reply, "report pid: %s", strerror(errno));
	int io[3] = {fds[0], fds[1], fds[2]};
	if (p->term) {
		int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (master < 0)
			child_fail(reply, "open /dev/ptmx: %s", strerror(errno));
		int unlock = 0;
		char name[128];
		if (ioctl(master, TIOCSPTLCK, &unlock) < 0 || ptsname_r(master, name, sizeof(name)) != 0)
			child_fail(reply, "set up the terminal: %s", strerror(errno));
		int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (slave < 0)
			child_fail(reply, "open %s: %s", name, strerror(errno));
		if (ioctl(slave, TIOCSCTTY, 0) < 0)
			child_fail(reply, "make %s the controlling terminal: %s", name, strerror(errno));
		if (send_fd(reply, 'T', master) < 0)
			child_fail(reply, "send the terminal: %s", strerror(errno));
		close(master);
		io[0] = io[1] = io[2] = slave;
	}
	// Move the descriptors above 2 first, so dup2 cannot clobber them.
	for (int i = 0; i < 3; i++) {
		int d = fcntl(io[i], F_DUPFD_CLOEXEC, 10);
		if (d < 0)
			child_fail(reply, "stdio: %s", strerror(errno));
		io[i] = d;
	}
	for (int i = 0; i < 3; i++)
		if (dup2(io[i], i) < 0)
			child_fail(reply, "stdio: %s", strerror(errno));
	// Everything but stdio and the reply socket (close on exec) goes,
	// marked now: a seccomp filter may refuse the call later.
	if (syscall(SYS_close_range, 3, ~0U, 0x4 /* CLOSE_RANGE_CLOEXEC */) < 0)
		child_fail(reply, "mark descriptors close-on-exec: %s", strerror(errno));
	if (p->affinity)
		set_affinity(reply, p->affinity);
	for (int i = 0; i < p->nrlimits; i++)
		if (setrlimit(p->rlimits[i].type, &p->rlimits[i].lim) < 0)
			child_fail(reply, "setrlimit %d: %s", p->rlimits[i].type, strerror(errno));
	if (p->oom_set) {
		char b[32];
		int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		snprintf(b, sizeof(b), "%d", p->oom);
		if (fd < 0 || write(fd, b, strlen(b)) < 0)
			child_fail(reply, "oom_score_adj: %s", strerror(errno));
		close(fd);
	}
	if (p->umask_set)
		umask(p->umask);
	// From here on, runc's order (libcontainer/standard_init_linux.go and
	// setns_init_linux.go): no_new_privs; then, without no_new_privs, the
	// seccomp filter while this process still has CAP_SYS_ADMIN, before
	// the user and capabilities change; with it, the filter just before
	// execve, so that as few calls as possible run under it.
	if (p->nnp && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		child_fail(reply, "no_new_privs: %s", strerror(errno));
	if (p->sched_set && syscall(SYS_sched_setattr, 0, &p->sched, 0) < 0)
		child_fail(reply, "set the scheduler: %s", strerror(errno));
	if (p->ioprio_set && syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PGRP */, 0, p->ioprio) < 0)
		child_fail(reply, "set the I/O priority: %s", strerror(errno));
	if (seccomp_len && !p->nnp)
		install_seccomp(reply);
	int last = 40;
	while (prctl(PR_CAPBSET_READ, last + 1) >= 0)
		last++;
	for (int c = 0; c <= last; c++)
		if (!(p->capb & (1ULL << c)) && prctl(PR_CAPBSET_DROP, c) < 0)
			child_fail(reply, "drop capability %d: %s", c, strerror(errno));
	if (prctl(PR_SET_KEEPCAPS, 1) < 0)
		child_fail(reply, "keep capabilities: %s", strerror(errno));
	if (setgroups(p->ngroups, p->groups) < 0)
		child_fail(reply, "setgroups: %s", strerror(errno));
	if (setresgid(p->gid, p->gid, p->gid) < 0)
		child_fail(reply, "setgid %u: %s", p->gid, strerror(errno));
	if (setresuid(p->uid, p->uid, p->uid) < 0)
		child_fail(reply, "setuid %u: %s", p->uid, strerror(errno));
	prctl(PR_SET_KEEPCAPS, 0);
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct d[2] = {
	    {.effective = p->cape, .permitted = p->capp, .inheritable = p->capi},
	    {.effective = p->cape >> 32, .permitted = p->capp >> 32, .inheritable = p->capi >> 32},
	};
	if (syscall(SYS_capset, &h, d) < 0)
		child_fail(reply, "set capabilities: %s", strerror(errno));
	prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	for (int c = 0; c <= last; c++)
		if ((p->capa & (1ULL << c)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c, 0, 0) < 0)
			child_fail(reply, "raise ambient capability %d: %s", c, strerror(errno));
	if (chdir(p->cwd && p->cwd[0] ? p->cwd : "/") < 0)
		child_fail(reply, "chdir %s: %s", p->cwd, strerror(errno));
	if (p->apparmor)
		apparmor_on_exec(reply, p->apparmor);
	p->args[p->nargs] = NULL;
	p->env[p->nenv] = NULL;
	if (p->nargs == 0)
		child_fail(reply, "no command");
	if (seccomp_len && p->nnp)
		install_seccomp(reply);
	const char *file = p->args[0];
	if (strchr(file, '/')) {
		execve(file, p->args, p->env);
		child_fail(reply, "exec %s: %s", file, strerror(errno));
	}
	const char *path = getenv_in(p, "PATH");
	if (!path)
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	int err = ENOENT;
	while (*path) {
		const char *colon = strchrnul(path, ':');
		char full[4096];
		int n = (int)(colon - path);
		snprintf(full, sizeof(full), "%.*s%s%s", n, path, n ? "/" : "", file);
		execve(full, p->args, p->env);
		if (errno != ENOENT && errno != ENOTDIR)
			err = errno;
		path = *colon ? colon + 1 : colon;
	}
	child_fail(reply, "exec %s: %s (looked in $PATH)", file, strerror(err));
}

// start forks a process; it returns its pid in the branch.
static pid_t start(struct proc *p, int fds[3], int reply) {
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0)
		exec_proc(p, fds, reply);
	return pid;
}

// parse splits a message body into its NUL-terminated strings.
static int parse(char *buf, size_t n, char **out, int max) {
	int k = 0;
	size_t i = 0;
	while (i < n && k < max) {
		out[k++] = buf + i;
		char *z = memchr(buf + i, 0, n - i);
		if (!z)
			fail("malformed message");
		i = (size_t)(z - buf) + 1;
	}
	return k;
}

static ssize_t recv_msg(char *buf, size_t size, int *fds, int *nfds) {
	struct iovec iov = {.iov_base = buf, .iov_len = size};
	union {
		char buf[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	ssize_t n;
	do
		n = recvmsg(CTL, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	*nfds = 0;
	if (n <= 0)
		return n;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			memcpy(fds + *nfds, CMSG_DATA(c), k * sizeof(int));
			*nfds += k;
		}
	if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		fail("message truncated");
	return n;
}

static void sendf(const char *fmt, ...) {
	char b[128];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	send(CTL, b, strlen(b), MSG_NOSIGNAL);
}

static char msgbuf[MSGMAX];
static char *words[MSGMAX / 2];
static struct proc cmdproc, execproc;

// run_ops executes the ops of a config in words, and takes the keys of
// its command into cmd (NULL: none allowed); it says whether the config
// has a command ('run').
static int run_ops(int nw, struct proc *cmd) {
	int have_cmd = 0;
	for (int i = 0; i < nw;) {
		const char *name = words[i++];
		if (cmd && !strcmp(name, "run")) {
			have_cmd = 1;
			continue;
		}
		int used = cmd ? proc_key(cmd, name, words + i, nw - i) : -1;
		if (used >= 0) {
			i += used;
			continue;
		}
		const struct op *o = NULL;
		for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
			if (!strcmp(ops[k].name, name))
				o = &ops[k];
		if (!o)
			fail("unknown op %s", name);
		if (nw - i < o->nargs)
			fail("op %s: missing arguments", name);
		o->fn(words + i);
		i += o->nargs;
	}
	return have_cmd;
}

void brinit(int argc, char **argv) {
	// Only a process the shim started as the init (argv ["brinit"]) is
	// taken over; in the shim, which links this file too, it returns.
	if (argc != 1 || argv == NULL || argv[0] == NULL || strcmp(argv[0], "brinit") != 0)
		return;
	sigset_t all;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, NULL);
	// Nothing in the branch may ptrace or read this privileged process.
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	// Named brinit once it is a branch's: an init waiting for its config
	// (in the pool, in the cgroup of a branch id not given yet) shows so.
	prctl(PR_SET_NAME, "brinit-wait", 0, 0, 0);
	// The control socket is not the branch's processes' either.
	if (fcntl(CTL, F_SETFD, FD_CLOEXEC) < 0)
		_exit(1);
	// Only the control socket (and stdio) is ours; whatever else the shim
	// had open without close-on-exec is not the branch's.
	syscall(SYS_close_range, CTL + 1, ~0U, 0);
	for (int i = 0; i < NSLOTS; i++)
		slots[i] = -1;
	int *fds = cfg_fds, nfds;
	ssize_t n = recv_msg(msgbuf, sizeof(msgbuf), fds, &nfds);
	if (n > 0 && msgbuf[0] == 'P') {
		// An init started ahead: the early part of a branch's root
		// (namespaces joined, filesystems made in slots), then the
		// config at the fork.
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		int nw = parse(msgbuf + 1, n - 1, words, MSGMAX / 2);
		if (run_ops(nw, NULL))
			fail("early set-up with a process");
		sendf("p");
		n = recv_msg(msgbuf, sizeof(msgbuf), fds, &nfds);
	}
	cfg_nfds = nfds;
	if (n <= 0)
		_exit(1);
	if (msgbuf[0] != 'C')
		fail("expected a config");
	prctl(PR_SET_NAME, "brinit", 0, 0, 0);
	int nw = parse(msgbuf + 1, n - 1, words, MSGMAX / 2);
	int have_cmd = run_ops(nw, &cmdproc);
	if (!pivoted)
		fail("config has no pivot");
	// What was made early and not attached (a config that did not use
	// it) goes.
	for (int i = 0; i < NSLOTS; i++)
		if (slots[i] >= 0) {
			close(slots[i]);
			slots[i] = -1;
		}
	int sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		fail("signalfd: %s", strerror(errno));
	if (!joined) {
		sendf("R");
		int gfds[8], ngfds;
		n = recv_msg(msgbuf, sizeof(msgbuf), gfds, &ngfds);
		if (n <= 0)
			_exit(1);
		for (int i = 0; i < ngfds; i++)
			close(gfds[i]);
		if (msgbuf[0] != 'G')
			fail("expected go");
	}
	if (want_cgroupns && unshare(CLONE_NEWCGROUP) < 0)
		fail("new cgroup namespace: %s", strerror(errno));
	pid_t cmd = 0;
	if (have_cmd) {
		// The command's stdio came with the config, after the rootfs:
		// stdin, stdout, stderr.
		if (cfg_nfds < 4)
			fail("run: no stdio");
		fds = cfg_fds + 1;
		int sp[2];
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
			fail("socketpair: %s", strerror(errno));
		cmd = start(&cmdproc, fds, sp[1]);
		if (cmd < 0)
			fail("fork: %s", strerror(errno));
		close(sp[1]);
		// The child reports its pid, then an exec error or nothing.
		char b[1100];
		ssize_t k;
		while ((k = recv(sp[0], b, sizeof(b) - 1, 0)) > 0)
			if (b[0] == 'E') {
				b[k] = 0;
				fail("%s", b + 1);
			}
		close(sp[0]);
		for (int i = 0; i < 3; i++)
			close(fds[i]);
	}
	sendf("O%d", (int)cmd);
	fds = cfg_fds;
	struct pollfd pf[3] = {{.fd = CTL, .events = POLLIN}, {.fd = sfd, .events = POLLIN}, {.fd = log_in, .events = POLLIN}};
	for (;;) {
		if (poll(pf, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			_exit(1);
		}
		if (pf[1].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) > 0)
				;
			int st;
			pid_t pid;
			while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
				if (pid == cmd)
					exit_branch(WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st));
				sendf("X%d %d", (int)pid, st);
			}
		}
		if (pf[2].revents && !log_pump(16)) {
			// Every writer is gone: the log is complete.
			close(log_in);
			log_in = pf[2].fd = -1;
		}
		if (pf[0].revents) {
			n = recv_msg(msgbuf, sizeof(msgbuf), fds, &nfds);
			if (n <= 0)
				_exit(0); // the shim is gone: so is the branch
			if (msgbuf[0] != 'E' || nfds < 1) {
				for (int i = 0; i < nfds; i++)
					close(fds[i]);
				sendf("S-1 bad request");
				continue;
			}
			memset(&execproc, 0, sizeof(execproc));
			nw = parse(msgbuf + 1, n - 1, words, MSGMAX / 2);
			int bad = 0;
			for (int i = 0; i < nw;) {
				int used = proc_key(&execproc, words[i], words + i + 1, nw - i - 1);
				if (used < 0) {
					bad = 1;
					break;
				}
				i += 1 + used;
			}
			int reply = fds[nfds - 1];
			int io[3] = {-1, -1, -1};
			if (!execproc.term) {
				if (nfds < 4)
					bad = 1;
				else
					io[0] = fds[0], io[1] = fds[1], io[2] = fds[2];
			}
			pid_t pid = bad ? -1 : start(&execproc, io, reply);
			for (int i = 0; i < nfds; i++)
				close(fds[i]);
			if (pid < 0)
				sendf("S-1 %s", bad ? "bad request" : strerror(errno));
			else
				sendf("S%d", (int)pid);
		}
	}
}
