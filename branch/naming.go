package branch

// The names every side agrees on: the runtime, the sockets.

// RuntimeName is the containerd runtime a sandbox must run on.
const RuntimeName = "io.containerd.branch.v1"

// TTRPCSuffix names the snapshotter's ttrpc socket: the branch API is
// served over gRPC at the snapshotter's address and over ttrpc at that
// address with this suffix, as containerd serves its API beside its gRPC
// socket. A call over ttrpc takes fewer hand-offs between threads, each of
// which costs 100 us or more on a busy machine.
const TTRPCSuffix = ".ttrpc"

// SelfSocket is where a process inside a sandbox run with the annotation
// io.branchbox.socket=true finds its own branch's socket.
const SelfSocket = "/run/branchbox/branch.sock"

// SelfSocketEnv names another socket path for DialSelf (tests, tools that
// run a branch's socket elsewhere).
const SelfSocketEnv = "BRANCHBOX_SOCKET"

// SelfRequestMax is the largest request a branch socket takes, in bytes:
// requests wait there (for the sandbox's call rate, for a process to
// exit), and the shim holds them meanwhile, outside the sandbox's limits.
const SelfRequestMax = 256 << 10

// DefaultSnapshotterAddress is where the snapshotter serves by default (its
// systemd unit, the generated containerd configuration).
const DefaultSnapshotterAddress = "/run/containerd-branch-snapshotter/snapshotter.sock"

// DeadlineHeader is the ttrpc metadata in which a client sends the shim
// its caller's deadline (Unix nanoseconds) for a call that makes
// something (a fork, an exec): the shim gives up there and undoes what it
// began, while the call itself waits for the shim's answer past it, so
// that what the shim made just before is known and undone by the client.
// With the deadline on the call alone, an answer made just in time came
// after the client's own timer, and nobody undid what it made.
const DeadlineHeader = "branchbox-caller-deadline"
