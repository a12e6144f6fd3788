// Errors of the leash client: one LeashError subclass per wire code of `leash serve`
// (docs/protocol.md, "Error codes"), and a few for what happens on the client's side
// (timeouts, aborts, a dropped connection, `leash exec` failing to start an adapter).
// `errorFromWire` maps a reply's `error` object once; codes it does not know (a newer daemon)
// become a plain LeashError that still carries the code and every extra field.

export class LeashError extends Error {
  /**
   * @param {string} message
   * @param {{ code?: string, data?: Record<string, unknown>, cause?: unknown }} [opts]
   */
  constructor(message, opts = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = opts.code ?? 'leash_error';
    /** Extra fields of the wire error (e.g. oldestSeq, lastSeq, exitStatus, stderr). */
    this.data = opts.data ?? {};
  }
}

function wire(code) {
  return class extends LeashError {
    constructor(message, opts = {}) {
      super(message, { ...opts, code });
    }
  };
}

// Named classes (not anonymous) so stack traces and `err.name` read well.
export class BadUtf8Error extends wire('bad_utf8') {}
export class BadJsonError extends wire('bad_json') {}
export class LineTooLongError extends wire('line_too_long') {}
export class BadRequestError extends wire('bad_request') {}
export class UnknownOpError extends wire('unknown_op') {}
export class NotFoundError extends wire('not_found') {}
export class NotVisibleError extends wire('not_visible') {}
export class ConflictError extends wire('conflict') {}
export class NotRunningError extends wire('not_running') {}
export class SeqEvictedError extends wire('seq_evicted') {}
/**
 * The adapter could not be started, through either door: `ensure` (the daemon's `spawn_failed`)
 * or `spawn()` (`leash exec` leaving with 125, or 127/126 with its JSON error line). The same
 * fields both ways: `data.exitStatus` (leash exec's status: 125, 126, 127, or the adapter's own
 * for an adapter that died at once), `data.cause` (leash's cause word when leash itself failed:
 * `adapter_not_found`, `adapter_not_executable`, `conflict`, `spawn_failed`, `internal`, …),
 * `data.stderr` (the adapter's last stderr lines, an array, without leash's error line),
 * `data.leaseId` (the lease leash exec committed, when it got that far). A cause a gateway
 * branches on has a class of its own below.
 */
export class SpawnFailedError extends wire('spawn_failed') {}
/** The adapter command was not found (not on PATH, no such file): leash exec's exit 127. */
export class AdapterNotFoundError extends SpawnFailedError {}
/** The adapter command exists but could not be executed (permission, interpreter): exit 126. */
export class AdapterNotExecutableError extends SpawnFailedError {}
/** The class of a failed start by leash's cause word (`data.cause`). */
export const SPAWN_CAUSES = {
  adapter_not_found: AdapterNotFoundError,
  adapter_not_executable: AdapterNotExecutableError,
};
/**
 * The adapter started and exited before its first line of output (`ensure` with `waitMs`; the
 * attach stream's `start_failed` end carries the same fields). A SpawnFailedError, so code that
 * caught the old early-exit answer keeps working.
 */
export class StartFailedError extends SpawnFailedError {
  constructor(message, opts = {}) {
    super(message, opts);
    this.code = 'start_failed';
  }
}
/**
 * The adapter did not answer the handshake in time: `ensure` with `initialize` (the daemon sent
 * it and waited `handshakeTimeoutMs`), the first request of an `acp()` channel opened with
 * `handshakeTimeoutMs`, or the first request written to a `spawn()` child given one. The session
 * (the lease) was closed before this error was raised: TERM, the grace, KILL; nothing of it runs.
 * `data.stderr` holds the adapter's last stderr lines, `data.leaseId` its lease.
 */
export class HandshakeTimeoutError extends wire('handshake_timeout') {}
/** `ensure`: a close of the key arrived while this ensure was starting it and closed what it started. */
export class ClosedError extends wire('closed') {}
export class ForbiddenError extends wire('forbidden') {}
export class ShuttingDownError extends wire('shutting_down') {}
export class InternalError extends wire('internal') {}

/** The daemon did not answer within the call's timeout (the call may still take effect). */
export class LeashTimeoutError extends wire('timeout') {}
/** The call's AbortSignal fired (the call may still take effect). */
export class LeashAbortError extends wire('aborted') {}
/** The connection closed before the reply came; the request may or may not have been applied. */
export class ConnectionClosedError extends wire('connection_closed') {}
/** No daemon answers for this state root (no socket, or a stale one). */
export class NoDaemonError extends wire('no_daemon') {}
/** A line from the daemon that is not valid protocol. */
export class ProtocolError extends wire('protocol') {}
/**
 * Another name for SpawnFailedError, kept for code that catches `spawn()`'s failures by it (one
 * class per cause, whichever door the start went through).
 */
export const ExecFailedError = SpawnFailedError;
/**
 * `resume()` could not restore the session's ACP context and the caller did not allow a fresh
 * one. `reason` says why: `no_acp_session` (no ACP session was recorded for it),
 * `ambiguous_acp_session` (several were, none interrupted: name one with `acpSessionId`),
 * `setup_unknown` (its cwd and mcpServers were not recorded: pass them), `load_unsupported`
 * (the agent has no `loadSession` capability), `load_failed` (`session/load` answered an error;
 * `cause` is the AcpError).
 */
export class ResumeError extends LeashError {
  constructor(message, opts = {}) {
    super(message, { ...opts, code: 'resume_failed' });
    this.reason = opts.reason;
  }
}
/** A JSON-RPC error response from the agent (see `acp()`). */
export class AcpError extends LeashError {
  constructor(message, opts = {}) {
    super(message, { ...opts, code: 'acp_error' });
    /** The JSON-RPC error code. */
    this.rpcCode = opts.rpcCode;
  }
}

export const WIRE_ERRORS = {
  bad_utf8: BadUtf8Error,
  bad_json: BadJsonError,
  line_too_long: LineTooLongError,
  bad_request: BadRequestError,
  unknown_op: UnknownOpError,
  not_found: NotFoundError,
  not_visible: NotVisibleError,
  conflict: ConflictError,
  not_running: NotRunningError,
  seq_evicted: SeqEvictedError,
  spawn_failed: SpawnFailedError,
  start_failed: StartFailedError,
  handshake_timeout: HandshakeTimeoutError,
  closed: ClosedError,
  forbidden: ForbiddenError,
  shutting_down: ShuttingDownError,
  internal: InternalError,
};

/** The typed error for a reply's `error` object. */
export function errorFromWire(error) {
  const { code, message, ...data } = error && typeof error === 'object' ? error : {};
  const Cls = (code === 'spawn_failed' && SPAWN_CAUSES[data.cause]) || WIRE_ERRORS[code];
  const msg = typeof message === 'string' ? message : `leash serve answered ${code ?? 'an error'}`;
  if (Cls) return new Cls(msg, { data });
  return new LeashError(msg, { code: typeof code === 'string' ? code : 'leash_error', data });
}

/**
 * The error a call rejects with when its AbortSignal fires: the signal's own reason when the
 * caller gave one, else a LeashAbortError (or LeashTimeoutError for AbortSignal.timeout()).
 */
export function abortError(signal, what) {
  const r = signal?.reason;
  if (r && r.name === 'TimeoutError') return new LeashTimeoutError(`${what}: timed out`, { cause: r });
  if (r instanceof Error && r.name !== 'AbortError') return r;
  return new LeashAbortError(`${what}: aborted`, { cause: r });
}
