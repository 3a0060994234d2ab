// Declarations of @branchbox/sdk (index.js), written by hand: the package
// ships as plain ESM with no build step. The types follow the contract,
// api/openapi/branchbox.json; integration/sdk_test.go type-checks them
// with tsc against the example.

export declare const DEFAULT_SOCKET: string;

/** branchctl --json's error kinds. */
export type ErrorKind =
  | 'stale' | 'not-found' | 'invalid-argument' | 'already-exists' | 'failed-precondition' | 'conflict'
  | 'unavailable' | 'not-implemented' | 'permission-denied' | 'resource-exhausted' | 'aborted'
  | 'canceled' | 'deadline-exceeded' | 'unknown';

export declare class BranchboxError extends Error {
  readonly kind: ErrorKind;
  readonly hint?: string;
  /** The HTTP status, when the error came as a response. */
  readonly status?: number;
  constructor(kind: ErrorKind, message: string, hint?: string, status?: number);
}

/** The branch lost: a sibling's commit invalidated it. */
export declare class StaleError extends BranchboxError {}

export interface ClientOptions {
  /** The server's unix socket (default /run/branchbox/api.sock). */
  socket?: string;
  /** Or its URL, http(s)://host:port (not both); a token is then required. */
  url?: string;
  token?: string;
  /** The containerd namespace every call is in (default "default"). */
  namespace?: string;
  /** CA certificate(s) to trust for https. */
  ca?: string | Buffer;
}

export type BranchState = 'live' | 'committing' | 'committed' | 'aborted' | 'stale';

/** A branch, as fork and tree describe it: the sandbox itself (id "0") or
 * a branch forked from it. (Branch is the class of the handle on one, as
 * BranchInfo is the Go client's name for this.) */
export interface BranchInfo {
  id: string;
  parent?: string;
  state: BranchState;
  epoch: number;
  created: string;
  sealed: boolean;
  seal?: string;
  upperSize: number;
  status?: string;
  initPid?: number;
  pids?: number[];
  winner?: string;
  children?: string[];
  net?: string;
  /** Its processes were restored from a memory image (a memory fork). */
  memoryFork?: boolean;
  [more: string]: unknown;
}

export interface SandboxSummary {
  id: string;
  name?: string;
  runtime: string;
  image?: string;
  created: string;
  status: string;
  branches: number;
  error?: string;
}

export interface Registry {
  plainHttp?: boolean;
  user?: string;
  secret?: string;
}

export interface CreateSandboxOptions extends Registry {
  id: string;
  image: string;
  args?: string[];
  env?: string[];
  /** Give the sandbox its branch socket (docs/in-sandbox.md). */
  socket?: boolean;
  /** Pull the image if containerd does not have it. */
  pull?: boolean;
}

export interface ForkOptions {
  count?: number;
  /** The branch to fork: "0" (default, the sandbox) or a branch id. */
  parent?: string;
  /** Fork from this checkpoint of the parent. */
  from?: string;
  seal?: 'ro' | 'freeze';
  net?: 'shared' | 'isolated';
  /** The branches' memory limit, bytes. */
  memory?: number;
  cpus?: number;
  pids?: number;
  /** Run as each branch's init instead of a waiting init. */
  args?: string[];
  /** Fork the running processes too (a memory fork; with from, the checkpoint's). */
  with_memory?: boolean;
  /** Aborting it before the answer disconnects: the server aborts the branches the fork made. */
  signal?: AbortSignal;
}

export interface CheckpointOptions {
  /** Record the branch's running processes too. */
  with_memory?: boolean;
}

export interface ExecOptions {
  env?: string[];
  cwd?: string;
  /** The whole standard input. */
  stdin?: string;
  /** Seconds; the process, and what it started, is killed after it. */
  timeout?: number;
  /** Aborting it disconnects, which kills the process and what it started. */
  signal?: AbortSignal;
}

export interface ExitStatus {
  exitCode: number;
  exitedAt: string;
  oomKilled: boolean;
  /** Set when the process was killed because its branch ended (another branch's commit made it stale, or it was aborted): why. */
  branchEnded?: string;
}

export interface ExecResult extends ExitStatus {
  stdout: string;
  stderr: string;
}

export type ExecEvent = { stdout: string } | { stderr: string } | { exit: ExitStatus };

export interface InteractiveExec extends AsyncIterable<ExecEvent> {
  /** Write to the process's standard input. */
  write(data: string): void;
  /** Close its standard input. */
  end(): void;
  /** Close stdin if still open, and wait for the whole result. */
  wait(): Promise<ExecResult>;
}

/** @deprecated BranchState's old name; removed in the release after next. */
export type ContextState = BranchState;
/** @deprecated BranchInfo's old name; removed in the release after next. */
export type Context = BranchInfo;

export interface CommitResult {
  parent: BranchInfo;
  invalidated: string[];
}

export interface DirEntry {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: string;
  modified: string;
  target?: string;
}

export interface Checkpoint {
  name: string;
  /** The branch it is a state of ("0": the sandbox). */
  branch: string;
  /** @deprecated branch under its old name; removed in the release after next. */
  context: string;
  parent?: string;
  created: string;
  size: number;
  entries: number;
  depth: number;
  head: boolean;
  children?: string[];
  branches?: string[];
  /** Bytes of its memory image, if it was taken with memory. */
  memory_bytes?: number;
}

export interface RollbackResult {
  branch: string;
  /** @deprecated branch under its old name; removed in the release after next. */
  context: string;
  checkpoint: string;
  seconds: number;
}

export interface PushOptions extends Registry {
  ref: string;
  branch?: string;
  checkpoint?: string;
}

export interface PushResult {
  ref: string;
  manifest: string;
  checkpoints: string[];
  sentBlobs: number;
  sentBytes: number;
  skippedBlobs: number;
}

export interface PullOptions extends Registry {
  ref: string;
  sandbox: string;
  args?: string[];
  noStart?: boolean;
}

export interface PullResult {
  ref: string;
  sandbox: string;
  checkpoints: string[];
  started: boolean;
}

export interface BranchboxEvent {
  timestamp: string;
  namespace: string;
  topic: string;
  event?: Record<string, unknown>;
}

export declare class Client {
  readonly namespace: string;
  constructor(opts?: ClientOptions);
  /** Close the connections kept alive. */
  close(): void;
  sandboxes(): Promise<SandboxSummary[]>;
  createSandbox(opts: CreateSandboxOptions): Promise<Sandbox>;
  sandbox(name: string): Sandbox;
  pull(opts: PullOptions): Promise<PullResult>;
  events(opts?: { topic?: string; signal?: AbortSignal }): AsyncIterable<BranchboxEvent>;
}

export declare class Sandbox {
  readonly client: Client;
  readonly name: string;
  /** The sandbox itself, branch "0". */
  readonly root: Branch;
  branch(id: string | number): Branch;
  fork(opts?: ForkOptions): Promise<Branch[]>;
  tree(): Promise<BranchInfo[]>;
  checkpoint(name: string, branch?: string, opts?: CheckpointOptions): Promise<Checkpoint>;
  checkpoints(): Promise<Checkpoint[]>;
  deleteCheckpoint(name: string): Promise<void>;
  rollback(name: string, branch?: string): Promise<RollbackResult>;
  push(opts: PushOptions): Promise<PushResult>;
  remove(): Promise<void>;
}

export declare class Branch {
  readonly sandbox: Sandbox;
  readonly id: string;
  /** The branch as fork returned it. */
  readonly info?: BranchInfo;
  execStream(args: string[], opts?: ExecOptions): AsyncIterable<ExecEvent>;
  exec(args: string[], opts?: ExecOptions): Promise<ExecResult>;
  /** Run args with its standard input open while its output comes. */
  execInteractive(args: string[], opts?: Omit<ExecOptions, 'stdin'>): InteractiveExec;
  readFile(path: string): Promise<Buffer>;
  writeFile(path: string, data: string | Uint8Array, opts?: { mode?: number }): Promise<{ path: string; size: number }>;
  listDir(path: string): Promise<DirEntry[]>;
  commit(): Promise<CommitResult>;
  /** What the branch's command (fork's args), or a memory branch's processes, wrote to stdout and stderr: its last 1-2 MiB. */
  logs(): Promise<Buffer>;
  abort(): Promise<string[]>;
}

export declare function bestOfN(
  sandbox: Sandbox,
  attempts: string[][],
  test: string[],
  opts?: ExecOptions,
): Promise<{ winner: Branch | null; results: (ExecResult | null)[] }>;
