// Types of leash-client (the implementation is src/*.js). The wire protocol is
// docs/protocol.md in the leash repository.
/// <reference types="node" />
import { EventEmitter } from 'node:events';
import { ChildProcess, StdioOptions } from 'node:child_process';

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type RequestId = string | number;

export interface CallOptions {
  /** Rejects the call with the signal's reason (or a LeashAbortError) when it fires. */
  signal?: AbortSignal;
  /** Rejects with LeashTimeoutError after this many ms (default: the client's timeoutMs). */
  timeoutMs?: number;
}

export interface ConnectOptions {
  /** The state root (default as the CLI: LEASH_STATE_DIR, $XDG_STATE_HOME/leash, ~/.local/state/leash). */
  stateDir?: string;
  /** The socket, overriding the one named in <stateDir>/daemon.lock. */
  socket?: string;
  /** Default per-call timeout (60 000 ms). */
  timeoutMs?: number;
  /** Reconnect with backoff when the connection drops (default true). */
  reconnect?: boolean;
  /** Give up reconnecting after this long (30 000 ms). */
  reconnectTimeoutMs?: number;
  /** Subscribe to lifecycle pushes (`resumable`, `resumed` events on the client). */
  events?: boolean;
}

export interface HelloResult {
  protocol: number;
  version: string;
  daemonPid: number;
  ops: string[];
  features: string[];
  events: boolean;
}

export type Phase = 'starting' | 'running' | 'closing' | 'ended';

export interface PendingPrompt {
  id: Json;
  acpSessionId: string | null;
  since: number;
}

/** An MCP server as ACP's session/new and session/load take it (passed on as given). */
export type McpServer = { name: string; [k: string]: Json };

/** An ACP session the adapter opened, with what it was opened with (recorded by the daemon). */
export interface AcpSessionSetup {
  sessionId: string;
  cwd?: string;
  mcpServers?: McpServer[];
}

export interface SessionStatus {
  sessionKey: string;
  leaseId: string | null;
  rootPid: number | null;
  phase: Phase;
  busy: boolean;
  pendingPrompts: PendingPrompt[];
  acpSessionIds: string[];
  /** Each ACP session with its cwd and mcpServers (absent when none was opened). */
  acpSessions?: AcpSessionSetup[];
  createdAt: number;
  idleMs: number;
  outputLines: number;
  oldestSeq: number | null;
  lastSeq: number;
  bufferedLines: number;
  bufferedBytes: number;
  attached: number;
  exitStatus: number | null;
}

export interface ResumableEntry {
  sessionKey: string;
  leaseId: string | null;
  pendingPrompts: PendingPrompt[];
  acpSessionIds: string[];
  /** The interrupted ACP sessions with the cwd and mcpServers they were opened with. */
  acpSessions?: AcpSessionSetup[];
  at: number;
  eventSeq?: number;
  /** In pushes: whether `ensure(session)` without argv can re-spawn it. */
  hasSpec?: boolean;
  /** In pushes: env names the stored spec keeps without values; `resume(session, { env })` must give them. */
  needsEnv?: string[];
}

export interface StatusResult {
  gatewayInstanceId: string;
  stateDir: string;
  database: string;
  wrapperRoot: string;
  leases: { open: number; closing: number; closed: number; lost: number; ended: number };
  legacyOpen: number;
  daemon: {
    pid: number;
    socket: string;
    startedAt: number;
    version: string;
    idleCloseMs: number | null;
    replayLines: number;
    replayBytes: number;
    shuttingDown: boolean;
    sessions: SessionStatus[];
    busy: string[];
    resumable: ResumableEntry[];
    startupReap: Record<string, number>;
    /** When the program that serves now began serving (ms since the epoch); after a live upgrade
     * `startedAt` stays the daemon's first start. */
    servingSince: number;
    /** Handoffs to a new program this daemon has done (`leash serve --upgrade`, SIGHUP). */
    handoffs: number;
    lastHandoff?: { at: number; from: string; to: string; ok: boolean; error?: string };
  };
  [k: string]: unknown;
}

export interface EnsureSpec {
  /** The adapter command. Omit it to re-spawn the session from its stored spec. */
  argv?: string[];
  cwd?: string;
  /**
   * Set in the adapter's environment, after the scrub (a name here passes whatever `unsetEnv`,
   * `clearEnv` and the daemon's default scrub say). On a resume (`argv` omitted) it gives the
   * values of a spec stored without them (see `persistEnv`).
   */
  env?: Record<string, string>;
  /** Variables removed from the daemon's environment, beside its default scrub of provider credentials. */
  unsetEnv?: string[];
  /** Start from an empty environment: only `keepEnv`, `env` and the lease markers pass. */
  clearEnv?: boolean;
  /** With `clearEnv`: the daemon's variables that pass; without it: names spared from the default scrub. */
  keepEnv?: string[];
  agent?: string;
  owner?: string;
  spawnedBy?: string;
  parent?: string;
  graceMs?: number;
  /** Keep the spec in the state database for `ensure(session)` (default true). */
  persistSpec?: boolean;
  /**
    /**
     * Store the values of `env` with the spec (default false: only the names are stored, and a
     * resume must give `env` again with a value for each).
     */
    persistEnv?: boolean;
    /**
     * How long to wait for a new adapter's first line of output (daemon default 0: no wait; at most
     * 60000). An exit before that line within the wait rejects with StartFailedError; after it, the
     * attach stream ends with reason `start_failed`.
     */
  waitMs?: number;
  /**
   * How long to wait behind an ensure of the same key in flight (FIFO, at most 16 queued) before
   * rejecting with ConflictError (daemon default 120000; 0: at once; at most 600000). Once
   * admitted the ensure answers as it would alone (`created: false` for the session its
   * predecessor started; a new session when that one failed or was closed).
   */
  queueTimeoutMs?: number;
  /**
   * The params of the ACP `initialize` the daemon sends a new adapter itself; the reply waits for
   * its response (`initialize`) within `handshakeTimeoutMs` (default 30000, at most 600000), else
   * rejects with HandshakeTimeoutError after the session was closed (nothing of it left).
   */
  initialize?: Record<string, unknown>;
  handshakeTimeoutMs?: number;
}

export interface EnsureResult {
  sessionKey: string;
  leaseId: string | null;
  rootPid: number | null;
  phase: Phase;
  created: boolean;
  lastSeq: number;
  /** False when a running session was found with another argv. */
  argvMatches?: boolean;
  /** With `initialize`, for a session it started: the adapter's response (`{jsonrpc, id: 'leash-handshake', result | error}`). */
  initialize?: { jsonrpc: '2.0'; id: string; result?: unknown; error?: { code: number; message: string; data?: unknown } } | null;
}

export interface SendResult {
  sessionKey: string;
  bytes: number;
  busy: boolean;
}

export type Target =
  | { session: string; lease?: never }
  | { lease: string; session?: never };

export interface CancelResult {
  leaseId: string;
  sessionKey: string | null;
  seq: number;
  acpSessionId: string | null;
  notified: boolean;
}

export interface CloseTargets {
  session?: string;
  lease?: string;
  sessions?: string[];
  leases?: string[];
  graceMs?: number;
  /** Also delete the daemon's stored specs and resumable entries of the sessions closed. */
  discardPersistentState?: boolean;
  /** Logged with the close (one line, at most 200 characters). */
  reason?: string;
}

export interface CloseOutcome {
  leaseId: string;
  sessionKey: string | null;
  result: 'closed' | 'lost' | 'leftOpen' | 'conflict';
  reason: string;
  signals: unknown[];
  refused: unknown[];
  exitStatus: number | null;
  [k: string]: unknown;
}

export interface ReapOptions {
  dryRun?: boolean;
  includeLive?: boolean;
  retentionMs?: number;
  graceMs?: number;
}

export interface LeaseEvent {
  seq: number;
  kind: string;
  leaseId: string | null;
  detail: Json;
  at: number;
  [k: string]: unknown;
}

export interface SessionsQuery {
  requesterSessionKey?: string;
  visibility?: 'self' | 'tree' | 'agent' | 'all';
  a2a?: boolean;
  a2aAllow?: string[];
  sandboxed?: boolean;
  query?: 'list' | 'history' | 'status';
  session?: string;
}

// --- attach ---------------------------------------------------------------------------------

export interface OutputItem { type: 'output'; seq: number; line: string; lossy?: boolean; truncated?: boolean }
export interface StderrItem { type: 'stderr'; seq: number; line: string; truncated?: boolean }
export interface EventItem { type: 'event'; seq: number; kind: string; leaseId: string | null; detail: Json; at: number }
/** Items that could not be delivered: `evicted` from the replay buffer, a `lease_changed` while away, a `clamped` since. */
export interface GapItem {
  type: 'gap';
  reason: 'evicted' | 'lease_changed' | 'clamped';
  /** The last seq received before the gap. */
  afterSeq: number;
  nextSeq?: number;
  oldestSeq?: number;
  lastSeq?: number;
  previousLeaseId?: string;
  leaseId?: string;
}
/** The last item: `ended` (everything delivered), `gone` (the daemon came back without the session), or another reason of a newer daemon. */
export interface EndItem {
  type: 'end';
  /** `start_failed`: the adapter exited before its first line of output (see `error`). */
  reason: 'ended' | 'start_failed' | 'gone' | string;
  lastSeq: number;
  message?: string;
  error?: { code: string; message: string; lastSeq: number; oldestSeq: number; exitStatus?: number | null; stderr?: string[] };
}
export type AttachItem = OutputItem | StderrItem | EventItem | GapItem | EndItem;

export interface AttachOptions {
  /** The last seq already seen (default 0), or 'now' for new items only. */
  since?: number | 'now';
  /** Also stream the adapter's stderr (default true, when the daemon has it). */
  stderr?: boolean;
  /** Detach when this many items wait for the consumer (default 10 000); reattach at lowWaterMark. */
  highWaterMark?: number;
  lowWaterMark?: number;
  signal?: AbortSignal;
  timeoutMs?: number;
}

export declare class AttachStream implements AsyncIterableIterator<AttachItem> {
  readonly lastSeq: number;
  readonly attachId: RequestId | null;
  readonly leaseId: string | null;
  ready(): Promise<this>;
  next(): Promise<IteratorResult<AttachItem, undefined>>;
  return(): Promise<IteratorResult<AttachItem, undefined>>;
  [Symbol.asyncIterator](): this;
}

// --- ACP ------------------------------------------------------------------------------------

export interface JsonRpcMessage {
  jsonrpc: '2.0';
  id?: RequestId | null;
  method?: string;
  params?: any;
  result?: any;
  error?: { code: number; message: string; data?: Json };
}

export declare class AcpChannel extends EventEmitter {
  readonly session: string;
  readonly stream: AttachStream | null;
  readonly pendingCount: number;
  ended: EndItem | null;
  request<R = any>(method: string, params?: unknown, opts?: CallOptions): Promise<R>;
  notify(method: string, params?: unknown, opts?: CallOptions): Promise<void>;
  cancel(acpSessionId: string, opts?: CallOptions): Promise<void>;
  respond(id: RequestId, result: unknown, opts?: CallOptions): Promise<void>;
  respondError(id: RequestId, code: number, message: string, data?: unknown, opts?: CallOptions): Promise<void>;
  close(): void;
  on(event: 'notification', listener: (msg: JsonRpcMessage, item: OutputItem) => void): this;
  on(event: 'request', listener: (msg: JsonRpcMessage, item: OutputItem) => void): this;
  on(event: 'stray', listener: (msg: JsonRpcMessage, item: OutputItem) => void): this;
  on(event: 'line', listener: (line: string, item: OutputItem) => void): this;
  on(event: 'stderr', listener: (line: string, item: StderrItem) => void): this;
  on(event: 'event', listener: (item: EventItem) => void): this;
  on(event: 'gap', listener: (item: GapItem) => void): this;
  on(event: 'end', listener: (item: EndItem) => void): this;
  on(event: 'close', listener: (err: Error) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

export interface AcpOptions extends CallOptions {
  since?: number | 'now';
  highWaterMark?: number;
  /** The channel's first request must be answered within this (ms), else the session is closed (TERM, grace, KILL) and the request rejects with HandshakeTimeoutError. */
  handshakeTimeoutMs?: number;
}

export interface ResumeOptions extends CallOptions {
  /** The continue prompt (default "Continue where you left off."); null sends none. */
  prompt?: string | null;
  /** The ACP session to load (default: the interrupted one, else the only one recorded). */
  acpSessionId?: string;
  /** Overrides the recorded cwd (required for a fresh session when nothing was recorded). */
  cwd?: string;
  /** Overrides the recorded mcpServers (likewise). */
  mcpServers?: McpServer[];
  /**
   * 'never' (default): a target that cannot be loaded rejects with ResumeError. 'allow': then a
   * fresh ACP session (session/new, same cwd and mcpServers) is opened instead.
   */
  fresh?: 'never' | 'allow';
  clientCapabilities?: Json;
  /** The env values of a spec stored without them (`persistEnv` not set): one per stored name. */
  env?: Record<string, string>;
}

export type ResumeFailure = 'no_acp_session' | 'ambiguous_acp_session' | 'setup_unknown' | 'load_unsupported' | 'load_failed';

export interface ResumeResult {
  acp: AcpChannel;
  acpSessionId: string;
  /** True when `session/load` restored the recorded ACP session. */
  loaded: boolean;
  /** True when a fresh ACP session was opened instead (only with fresh: 'allow'). */
  fresh: boolean;
  /** Why the target could not be loaded, when `fresh`. */
  freshReason: ResumeFailure | null;
  cwd: string;
  mcpServers: McpServer[];
  ensured: EnsureResult;
  resumable: ResumableEntry | null;
  initialize: any;
  response: any;
}

// --- the client -----------------------------------------------------------------------------

export declare function connect(opts?: ConnectOptions): Promise<LeashClient>;

export declare class LeashClient extends EventEmitter {
  constructor(opts?: ConnectOptions);
  info: HelloResult | null;
  /** Resumable sessions pushed on this connection, until resumed. */
  resumable: Map<string, ResumableEntry & { type: 'resumable' }>;
  readonly stateDir: string;
  readonly connected: boolean;
  readonly features: string[];
  supports(feature: string): boolean;
  open(): Promise<void>;
  request<R = any>(op: string, fields?: Record<string, unknown>, opts?: CallOptions): Promise<R>;
  static requestLine(id: RequestId, op: string, fields: Record<string, unknown>): string;
  writeRaw(data: string | Uint8Array): void;
  dropConnection(): void;
  disconnect(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;

  hello(opts?: CallOptions): Promise<HelloResult>;
  ping(opts?: CallOptions): Promise<{ pong: true; at: number }>;
  status(opts?: CallOptions): Promise<StatusResult>;
  ensure(session: string, spec?: EnsureSpec, opts?: CallOptions): Promise<EnsureResult>;
  send(session: string, line: string, opts?: CallOptions): Promise<SendResult>;
  attach(session: string, opts?: AttachOptions): AttachStream;
  detach(attachId: RequestId, opts?: CallOptions): Promise<{ attachId: RequestId; detached: number }>;
  cancel(target: string | (Target & { acpSessionId?: string }), opts?: CallOptions): Promise<CancelResult>;
  close(target: string | CloseTargets, opts?: CallOptions): Promise<CloseOutcome[]>;
  reap(options?: ReapOptions, opts?: CallOptions): Promise<any>;
  leases(filter?: { state?: LeaseState }, opts?: CallOptions): Promise<any[]>;
  sessions(query?: SessionsQuery, opts?: CallOptions): Promise<any>;
  events(session: string, since?: number, opts?: CallOptions): Promise<LeaseEvent[]>;
  verify(fields?: Record<string, unknown>, opts?: CallOptions): Promise<any>;
  subscribe(opts?: CallOptions): Promise<void>;
  acp(session: string, opts?: AcpOptions): Promise<AcpChannel>;
  resume(session: string, opts?: ResumeOptions): Promise<ResumeResult>;

  on(event: 'resumable', listener: (item: ResumableEntry & { type: 'resumable' }) => void): this;
  on(event: 'resumed', listener: (item: { type: 'resumed'; sessionKey: string; leaseId: string | null }) => void): this;
  on(event: 'lifecycle', listener: (item: { type: string; [k: string]: unknown }) => void): this;
  on(event: 'connect' | 'reconnect', listener: (info: HelloResult | null) => void): this;
  on(event: 'disconnect', listener: () => void): this;
  on(event: 'close', listener: (err: Error) => void): this;
  on(event: 'protocolError', listener: (err: LeashError) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

// --- spawn and CLI fallbacks ----------------------------------------------------------------

/** A lease's state (README.md, "Lease states"): `ended` is an end leash saw (the adapter exited,
 * or could not be started), `lost` a tree it lost sight of without seeing it end. */
export type LeaseState = 'open' | 'closing' | 'closed' | 'ended' | 'lost';

export interface SpawnOptions {
  /** The lease id (a canonical UUID no lease has; default: a fresh UUIDv7), see `child.leaseId`. */
  leaseId?: string;
  session?: string;
  agent?: string;
  owner?: string;
  spawnedBy?: string;
  parent?: string;
  graceMs?: number;
  /** The whole environment of leash exec and the adapter, as child_process.spawn takes it. */
  env?: NodeJS.ProcessEnv;
  /** Removed from the adapter's environment (`leash exec --unset-env`); the lease markers always survive. */
  unsetEnv?: string[];
  /** Start the adapter from an empty environment (`--clear-env`): only `keepEnv` and the lease markers pass. */
  clearEnv?: boolean;
  /** With `clearEnv`: the variables that pass (`--keep-env`), e.g. `['PATH', 'HOME']`. */
  keepEnv?: string[];
  cwd?: string;
  stdio?: StdioOptions;
  signal?: AbortSignal;
  /** The owner (default: this process). */
  ownerPid?: number;
  stateDir?: string;
  /** The leash binary (default LEASH_BIN, else `leash` on PATH). */
  leashBin?: string;
  /** The first JSON-RPC request written to the child's stdin must be answered on its stdout within this (ms), else the lease is closed and the child emits HandshakeTimeoutError ('error'). Needs piped stdio. */
  handshakeTimeoutMs?: number;
}

/** `leash exec`'s child: a ChildProcess whose lease id is known before leash exec runs. */
export interface LeasedChildProcess extends ChildProcess {
  readonly leaseId: string;
}

/**
 * `child_process.spawn` through `leash exec`. When the adapter cannot be started, the child emits
 * a `SpawnFailedError` ('error' event) after its 'exit', as `ensure` rejects with one: exit 125
 * (leash itself failed), 127 (the adapter was not found: an `AdapterNotFoundError`) or 126 (not
 * executable: an `AdapterNotExecutableError`); see `SpawnFailureData` for its fields.
 */
export declare function spawn(argv: string[], opts?: SpawnOptions): LeasedChildProcess;
export declare function execArgs(argv: string[], opts?: SpawnOptions): string[];
/** A UUIDv7 as leash makes lease ids. */
export declare function uuidv7(): string;

export interface CliOptions extends CallOptions {
  stateDir?: string;
  socket?: string;
  leashBin?: string;
}
export declare function close(target: string | CloseTargets, opts?: CliOptions): Promise<CloseOutcome[]>;
export declare function reap(options?: ReapOptions, opts?: CliOptions): Promise<any>;
export declare function verify(fields?: { session?: string; lease?: string }, opts?: CliOptions): Promise<any>;
/** Options of {@link simulate}. */
export interface SimulateOptions {
  /** Replay `leash close` of this lease instead of `leash reap`. */
  close?: string;
  /** Replay `leash verify` of this lease instead of `leash reap`. */
  verify?: string;
  /** An expectation file ({"signalled": [...], "notSignalled": [...]}, or a snapshot holding one under "expect"). */
  expect?: string;
  /** The leash binary (default LEASH_BIN, else `leash` on PATH). */
  leashBin?: string;
  signal?: AbortSignal;
}
/** One line of a simulated timeline. */
export interface SimEvent {
  /** Simulated time, ms. */
  at: number;
  pid: number;
  event: 'signal' | 'refused' | 'cgroupKill';
  signal?: 'SIGTERM' | 'SIGKILL';
  group?: boolean;
  delivery?: 'delivered' | 'alreadyGone' | 'cgroupKill';
  members?: number[];
  reason?: string;
  cgroup?: string;
}
/** What `leash simulate FILE --json` prints, plus its exit status. */
export interface Simulation {
  verb: 'reap' | 'close' | 'verify';
  leaseId?: string;
  /** What `leash reap --dry-run --json` would print. */
  plan: any;
  reap?: any;
  close?: CloseOutcome[];
  verify?: any;
  timeline: SimEvent[];
  /** The pids signalled, in the order first signalled. */
  signalled: number[];
  /** [pid, ms] of each process that exited. */
  exits: [number, number][];
  expect?: { expected: { signalled?: number[]; notSignalled: number[] }; diff: string[] };
  /** 0 no signal (with expect: it holds), 1 some, 2 the expectation does not hold. */
  exitStatus: 0 | 1 | 2;
}
/** Replays a snapshot (`leash snapshot`, or a fixture written by hand) through `leash simulate`. Signals nothing. */
export declare function simulate(file: string, options?: SimulateOptions): Promise<Simulation>;
export declare function resolveStateDir(stateDir?: string): string;
export declare function findSocket(opts?: { stateDir?: string; socket?: string }): Promise<string>;

/** The binaries leash-client can find: the daemon/CLI and the per-session wrapper. */
export type BinaryName = 'leash' | 'leash-wrap';
/**
 * The path of `leash` or `leash-wrap`: the platform package's copy (`leash-client-<platform>-<arch>`,
 * an optional dependency of leash-client), else `$LEASH_BIN_DIR/<name>`, else the first on PATH.
 * Throws BinaryNotFoundError naming every place tried.
 */
export declare function binaryPath(name: BinaryName, opts?: { env?: NodeJS.ProcessEnv }): string;
/** The npm name of the platform package for a platform and CPU (default: this process's). */
export declare function platformPackage(platform?: string, arch?: string): string;

export interface StartDaemonOptions {
  /** The state directory (default: as the CLI finds it: LEASH_STATE_DIR, XDG_STATE_HOME, HOME). */
  stateDir?: string;
  /** Extra arguments of `leash serve` (e.g. ['--metrics', '127.0.0.1:9464']). */
  args?: string[];
  /** The daemon's environment (default: this process's; LEASH_STATE_DIR is dropped). */
  env?: NodeJS.ProcessEnv;
  /** Where the daemon's log (its stderr) goes (default 'inherit'). */
  stderr?: 'inherit' | 'ignore' | number;
  /** How long to wait for it to answer (default 30 000 ms). */
  timeoutMs?: number;
}

export interface DaemonExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  error?: Error;
}

export interface Daemon {
  /** The daemon's pid. */
  pid: number;
  stateDir: string;
  /** Whether startDaemon started it (false: it found one already serving the state directory). */
  started: boolean;
  /** Resolves when a daemon this process started exits; null for one it found. */
  exited: Promise<DaemonExit> | null;
  /**
   * Ends a daemon startDaemon started: SIGTERM (it closes its sessions first), then waits for it
   * to exit (SIGKILL past graceMs, default 60 000). Leaves a daemon it found running.
   */
  stop(opts?: { graceMs?: number }): Promise<DaemonExit | null>;
}

/**
 * Starts `leash serve` (from binaryPath('leash')) for a state directory, or finds the daemon
 * already serving it, and resolves once it answers.
 */
export declare function startDaemon(opts?: StartDaemonOptions): Promise<Daemon>;

// --- errors ---------------------------------------------------------------------------------

export declare class LeashError extends Error {
  constructor(message: string, opts?: { code?: string; data?: Record<string, unknown>; cause?: unknown });
  code: string;
  data: Record<string, any>;
}
/** binaryPath found no usable binary; `tried` says where it looked and why each was not taken. */
export declare class BinaryNotFoundError extends LeashError {
  constructor(name: BinaryName, tried: { path: string; why: string }[]);
  binary: BinaryName;
  tried: { path: string; why: string }[];
}
export declare class BadUtf8Error extends LeashError {}
export declare class BadJsonError extends LeashError {}
export declare class LineTooLongError extends LeashError {}
export declare class BadRequestError extends LeashError {}
export declare class UnknownOpError extends LeashError {}
export declare class NotFoundError extends LeashError {}
export declare class NotVisibleError extends LeashError {}
export declare class ConflictError extends LeashError {}
export declare class NotRunningError extends LeashError {}
export declare class SeqEvictedError extends LeashError {}
/** The fields of a failed start, the same through `ensure` and `spawn()`. */
export interface SpawnFailureData {
  /** leash exec's exit status (125, 126, 127), or the adapter's own when it died at once; `null` when unknown. */
  exitStatus: number | null;
  /** leash's cause word when leash itself failed: `adapter_not_found`, `adapter_not_executable`, `conflict`, `spawn_failed`, `internal`, … */
  cause?: string;
  /** The adapter's last stderr lines (leash's own error line is the message, not one of them). */
  stderr: string[];
  /** The lease leash exec committed, when it got that far. */
  leaseId?: string;
  /** The adapter command (`spawn()`, and `ensure` given `argv`). */
  argv?: string[];
  [key: string]: any;
}
/** The adapter could not be started (`ensure`'s `spawn_failed`, `spawn()`'s exit 125/126/127). */
export declare class SpawnFailedError extends LeashError {
  data: SpawnFailureData;
}
/** `data.cause` `adapter_not_found`: the adapter command was not found (exit 127). */
export declare class AdapterNotFoundError extends SpawnFailedError {}
/** `data.cause` `adapter_not_executable`: the adapter command could not be executed (exit 126). */
export declare class AdapterNotExecutableError extends SpawnFailedError {}
/** The class of a failed start by its cause word. */
export declare const SPAWN_CAUSES: Record<string, typeof SpawnFailedError>;
/** The adapter exited before its first line of output (`data.exitStatus`, `data.stderr`). */
export declare class StartFailedError extends SpawnFailedError {}
/** The adapter did not answer the handshake in time (`initialize` of ensure, the first request of acp()/spawn() with handshakeTimeoutMs); its session or lease was closed first. `data.stderr`: its last stderr lines; `data.leaseId`. */
export declare class HandshakeTimeoutError extends LeashError {}
/** `ensure`: a close of the key arrived while the ensure was in flight and closed what it started. */
export declare class ClosedError extends LeashError {}
export declare class ForbiddenError extends LeashError {}
export declare class ShuttingDownError extends LeashError {}
export declare class InternalError extends LeashError {}
export declare class LeashTimeoutError extends LeashError {}
export declare class LeashAbortError extends LeashError {}
export declare class ConnectionClosedError extends LeashError {}
export declare class NoDaemonError extends LeashError {}
export declare class ProtocolError extends LeashError {}
/** Another name for `SpawnFailedError`, kept for code that catches `spawn()`'s failures by it. */
export declare const ExecFailedError: typeof SpawnFailedError;
export type ExecFailedError = SpawnFailedError;
export declare class AcpError extends LeashError {
  rpcCode: number | undefined;
}
/** resume() (or ensureSession with resumeSessionId) could not restore the ACP session. */
export declare class ResumeError extends LeashError {
  readonly code: 'resume_failed';
  reason: ResumeFailure;
}
/** closeSession: the live tree's ownership could not be proven; nothing was signalled. */
export declare class CloseRefusedError extends LeashError {
  data: { outcomes: CloseOutcome[] };
}
export declare const WIRE_ERRORS: Record<string, typeof LeashError>;
export declare function errorFromWire(error: unknown): LeashError;

// --- the design's lifecycle controller and session rows ---------------------------------------

/** Made once per install and kept in its state; not a secret: an ownership discriminator. */
export type GatewayInstanceId = string;

/** The ownership metadata every spawned ACP session carries (the design's session row). */
export type AcpSessionOwner = {
  sessionKey: string;
  spawnedBy?: string;
  parentSessionKey?: string;
  ownerSessionKey: string;
  agentId: string;
  backend: 'acpx';
  gatewayInstanceId: GatewayInstanceId;
  createdAt: number;
};

/** A process lease as the incumbent records it (and `leash legacy import --acpx` reads it). */
export type AcpxProcessLease = {
  leaseId: string;
  gatewayInstanceId: GatewayInstanceId;
  sessionKey: string;
  wrapperRoot: string;
  wrapperPath: string;
  rootPid: number;
  processGroupId?: number;
  commandHash: string;
  startedAt: number;
  state: 'open' | 'closing' | 'closed' | 'lost';
};

/** The incumbent's runtime handle, plus the lease. */
export type AcpRuntimeHandle = {
  sessionKey: string;
  backend: string;
  runtimeSessionName: string;
  cwd?: string;
  acpxRecordId?: string;
  backendSessionId?: string;
  agentSessionId?: string;
};

export type AcpxRuntimeHandle = AcpRuntimeHandle & {
  backend: 'acpx';
  backendSessionId: string;
  leaseId: string | null;
  rootPid: number | null;
};

export type AcpRuntimeSessionMode = 'persistent' | 'oneshot';

/** The incumbent's ensure input. */
export type AcpRuntimeEnsureInput = {
  sessionKey: string;
  agent: string;
  mode: AcpRuntimeSessionMode;
  resumeSessionId?: string;
  cwd?: string;
  env?: Record<string, string>;
};

/** What AcpxLifecycleController.ensureSession takes: the incumbent's input and the session row's fields. */
export type AcpxEnsureInput = Omit<AcpRuntimeEnsureInput, 'mode'> & {
  /** persistent (default): the spec is stored for resume; oneshot: it is not. */
  mode?: AcpRuntimeSessionMode;
  agentId?: string;
  ownerSessionKey?: string;
  spawnedBy?: string;
  parentSessionKey?: string;
  /** The session's MCP servers (default: the controller's). */
  mcpServers?: McpServer[];
  /** How long a new adapter may leave the `initialize` the daemon sends unanswered (default 30000): then HandshakeTimeoutError, the session closed. */
  handshakeTimeoutMs?: number;
};

export interface OwnedProcessMember {
  pid: number;
  startTime: number;
  role: string;
  argv0: string;
}

/** A lease's live tree, proven to be the lease's own by the daemon. */
export interface OwnedProcessTree {
  leaseId: string;
  sessionKey: string;
  rootPid: number;
  rootStartTime: number;
  members: OwnedProcessMember[];
  evidence: string[];
}

export interface ImportAcpxOptions {
  stateDir?: string;
  /** The leash binary (default: LEASH_BIN, else `leash` on PATH). */
  leashBin?: string;
  /** The OpenClaw state directory (default: the parent of acpxDir). */
  openclawState?: string;
  /** The acpx session records' directory (default: <acpxDir>/sessions). */
  acpxSessions?: string;
  /** Adopt the incumbent's gateway id although the root already uses another. */
  adoptGatewayId?: boolean;
}

/** `leash legacy import --acpx DIR`: the incumbent's own state into the state root, all or nothing. */
export declare function importAcpxState(acpxDir: string, opts?: ImportAcpxOptions): Promise<{ report: string[] }>;

/** The design's interface, method for method. */
export interface AcpxLifecycleControllerContract {
  ensureSession(input: AcpRuntimeEnsureInput): Promise<AcpRuntimeHandle>;
  cancelTurn(handle: AcpRuntimeHandle): Promise<void>;
  closeSession(input: { handle: AcpRuntimeHandle; discardPersistentState?: boolean; reason?: string }): Promise<unknown>;
  reapStartupOrphans(): Promise<unknown>;
  verifyOwnedTree(lease: AcpxProcessLease): Promise<OwnedProcessTree | null>;
}

export interface AcpxLifecycleControllerOptions {
  client: LeashClient;
  /** Adapter argv per agent name (or a function from the name). */
  agents: Record<string, string[]> | ((agent: string) => string[] | undefined);
  /** Default MCP servers of a session (or a function of its input); default none. */
  mcpServers?: McpServer[] | ((input: AcpxEnsureInput) => McpServer[]);
  clientCapabilities?: Json;
  /** Disconnect the client with the controller. */
  ownsClient?: boolean;
}

export declare class AcpxLifecycleController implements AcpxLifecycleControllerContract {
  constructor(opts: AcpxLifecycleControllerOptions);
  static connect(opts: ConnectOptions & Omit<AcpxLifecycleControllerOptions, 'client' | 'ownsClient'>): Promise<AcpxLifecycleController>;
  /** The migration step: `leash legacy import --acpx DIR`, before `leash serve` starts on the root. */
  static importAcpxState(acpxDir: string, opts?: ImportAcpxOptions): Promise<{ report: string[] }>;
  readonly client: LeashClient;
  gatewayInstanceId(): Promise<GatewayInstanceId>;
  ensureSession(input: AcpxEnsureInput, opts?: CallOptions): Promise<AcpxRuntimeHandle>;
  cancelTurn(handle: AcpRuntimeHandle, opts?: CallOptions): Promise<void>;
  closeSession(input: { handle: AcpRuntimeHandle; discardPersistentState?: boolean; reason?: string }, opts?: CallOptions): Promise<CloseOutcome[]>;
  reapStartupOrphans(opts?: CallOptions & { dryRun?: boolean }): Promise<any>;
  verifyOwnedTree(lease: Pick<AcpxProcessLease, 'leaseId'> & Partial<AcpxProcessLease>, opts?: CallOptions): Promise<OwnedProcessTree | null>;
  /** The ACP channel of a session this controller ensured. */
  channel(handle: AcpRuntimeHandle): AcpChannel;
  /** One turn: session/prompt with a text block; resolves with the agent's response. */
  prompt(handle: AcpxRuntimeHandle, text: string, opts?: CallOptions): Promise<{ stopReason: string; [k: string]: unknown }>;
  disconnect(): Promise<void>;
}

// --- visibility -------------------------------------------------------------------------------

export type SessionVisibility = 'self' | 'tree' | 'agent' | 'all';
/** As leash writes it: off, or on with directional FROM:TO rules (`*` wildcards; none: every pair). */
export type A2aPolicy = { mode: 'off' } | { mode: 'on'; rules?: string[] } | 'off' | 'on';
/** A session row's ownership fields; null or '' mean not recorded (old rows). */
export type SessionRowMeta = {
  sessionKey: string;
  agentId?: string | null;
  ownerSessionKey?: string | null;
  spawnedBy?: string | null;
  parentSessionKey?: string | null;
  [k: string]: unknown;
};
export type SessionGrant = 'requester' | 'owned' | 'same agent' | 'a2a';
export interface SessionVisibilityInput {
  row: SessionRowMeta | AcpSessionOwner;
  requesterSessionKey: string;
  visibility: SessionVisibility;
  a2aPolicy?: A2aPolicy;
  /** A sandboxed requester is clamped to tree. */
  sandboxed?: boolean;
  /** The rows the caller loaded: the requester's agent and transitive tree come from them (default: [row]). */
  rows?: Array<SessionRowMeta | AcpSessionOwner>;
}
export declare function canSeeSessionRow(input: SessionVisibilityInput): boolean;
export declare function sessionRowGrant(input: SessionVisibilityInput): SessionGrant | null;
export declare function sessionRequester(requesterSessionKey: string, rows?: SessionRowMeta[]): { key: string; agent: string | null; tree: Set<string> };
export declare function agentFromKey(key: string): string | null;
export declare function rowAgent(row: SessionRowMeta): string | null;
export declare function parseA2aRule(rule: string): { from: string; to: string };
