// The design's lifecycle controller (`AcpxLifecycleController`: ensureSession, cancelTurn,
// closeSession, reapStartupOrphans, verifyOwnedTree), implemented over `leash serve`. A gateway
// written against this interface keeps its ACP runtime and leaves processes to leash: every
// adapter runs under a lease, cancel only cancels the turn, close signals only a tree the
// daemon verified as the lease's own, and the startup reap starts from the leases in the state
// root, never from a scan for ACP-looking commands.
//
// ensureSession starts (or finds) the session's adapter with `ensure`, then opens its ACP
// session: `initialize` and `session/new` with the input's cwd and mcpServers, or `session/load`
// of `resumeSessionId` (a ResumeError when the agent cannot load it: never a fresh context in
// its place). An adapter that is already running (started by this controller, or by an earlier
// process of the gateway while the daemon kept it) is reused with the ACP session the daemon
// recorded for it. The handle is the incumbent's AcpRuntimeHandle plus the lease id.

import { connect } from './client.js';
import { importAcpxState } from './spawn.js';
import { AcpError, LeashError, NotFoundError, ResumeError } from './errors.js';

const DEFAULT_CAPABILITIES = { fs: { readTextFile: false, writeTextFile: false }, terminal: false };

/** Raised by closeSession when the daemon could not prove the live tree is the lease's own. */
export class CloseRefusedError extends LeashError {
  constructor(message, opts = {}) {
    super(message, { ...opts, code: 'close_refused' });
  }
}

/** The result of the daemon's initialize (the ensure reply's `initialize` response). */
function initResult(response, sessionKey) {
  if (response && typeof response === 'object' && response.error) {
    const e = response.error;
    throw new AcpError(`ensureSession ${sessionKey}: initialize: ${e.message ?? 'error'}`, { rpcCode: e.code, data: { rpcError: e } });
  }
  return response?.result ?? null;
}

export class AcpxLifecycleController {
  #client;
  #ownsClient;
  #agents;
  #mcpServers;
  #capabilities;
  /** sessionKey -> { handle, acp, leaseId } for the sessions this controller opened. */
  #open = new Map();

  /**
   * @param {import('../index.js').AcpxLifecycleControllerOptions} opts
   */
  constructor(opts = {}) {
    if (!opts.client) throw new TypeError('AcpxLifecycleController: pass a connected client (or use AcpxLifecycleController.connect)');
    if (!opts.agents || (typeof opts.agents !== 'function' && typeof opts.agents !== 'object')) {
      throw new TypeError('AcpxLifecycleController: agents must map agent names to adapter argv (an object or a function)');
    }
    this.#client = opts.client;
    this.#ownsClient = !!opts.ownsClient;
    this.#agents = opts.agents;
    this.#mcpServers = opts.mcpServers ?? [];
    this.#capabilities = opts.clientCapabilities ?? DEFAULT_CAPABILITIES;
  }

  /**
   * The migration step before the first start on an existing install: imports the acpx
   * extension's own state (its process leases, gateway instance id and session records) into the
   * state root, so the daemon's start-up reap (and `reapStartupOrphans`) ends its orphans,
   * fail-safe. Run it before `leash serve` starts on the root.
   */
  static importAcpxState(acpxDir, opts = {}) {
    return importAcpxState(acpxDir, opts);
  }

  /** Connects to the daemon of a state root and returns a controller that owns the connection. */
  static async connect(opts = {}) {
    const { agents, mcpServers, clientCapabilities, ...connectOpts } = opts;
    const client = await connect(connectOpts);
    return new AcpxLifecycleController({ client, ownsClient: true, agents, mcpServers, clientCapabilities });
  }

  get client() {
    return this.#client;
  }

  /** This state root's GatewayInstanceId (the ownership discriminator in every lease). */
  async gatewayInstanceId() {
    return (await this.#client.status()).gatewayInstanceId;
  }

  #argv(agent) {
    const argv = typeof this.#agents === 'function' ? this.#agents(agent) : this.#agents[agent];
    if (!Array.isArray(argv) || argv.length === 0 || typeof argv[0] !== 'string' || argv[0] === '') {
      throw new TypeError(`ensureSession: no adapter command for agent ${JSON.stringify(agent)} (add it to agents)`);
    }
    return argv;
  }

  #mcpFor(input) {
    if (input.mcpServers !== undefined) return input.mcpServers;
    return typeof this.#mcpServers === 'function' ? this.#mcpServers(input) : this.#mcpServers;
  }

  /**
   * @param {import('../index.js').AcpxEnsureInput} input
   * @returns {Promise<import('../index.js').AcpxRuntimeHandle>}
   */
  async ensureSession(input, opts = {}) {
    const { sessionKey, agent } = input ?? {};
    if (typeof sessionKey !== 'string' || sessionKey === '') throw new TypeError('ensureSession: sessionKey must be a non-empty string');
    if (typeof agent !== 'string' || agent === '') throw new TypeError('ensureSession: agent must be a non-empty string');
    const mode = input.mode ?? 'persistent';
    if (mode !== 'persistent' && mode !== 'oneshot') throw new TypeError(`ensureSession: mode must be persistent or oneshot, not ${JSON.stringify(mode)}`);
    // Resuming: the cwd and mcpServers the daemon recorded for that ACP session (before the
    // ensure, which takes a session off the resumable list) win over the defaults.
    let recorded = null;
    if (input.resumeSessionId) {
      const st = await this.#client.status(opts);
      const all = [...(st.daemon.resumable ?? []), ...(st.daemon.sessions ?? [])]
        .filter((s) => s.sessionKey === sessionKey)
        .flatMap((s) => s.acpSessions ?? []);
      recorded = all.find((a) => a.sessionId === input.resumeSessionId) ?? null;
    }
    const cwd = input.cwd ?? recorded?.cwd ?? process.cwd();
    const mcpServers = input.mcpServers ?? recorded?.mcpServers ?? this.#mcpFor(input);
    const spec = {
      argv: this.#argv(agent),
      cwd,
      agent: input.agentId ?? agent,
      persistSpec: mode === 'persistent',
    };
    if (input.env) spec.env = input.env;
    if (input.ownerSessionKey) spec.owner = input.ownerSessionKey;
    if (input.spawnedBy) spec.spawnedBy = input.spawnedBy;
    if (input.parentSessionKey) spec.parent = input.parentSessionKey;
    // The handshake deadline: the daemon sends a new adapter `initialize` itself and answers
    // only once it responded, or fails HandshakeTimeoutError after closing the session (so a
    // silent or non-ACP adapter neither hangs this call nor leaves a process per retry).
    // A daemon without the feature (older) refuses the fields: the controller then sends
    // initialize itself, and a handshakeTimeoutMs is refused rather than silently not kept.
    if (this.#client.features.includes('ensure.handshake')) {
      spec.initialize = { protocolVersion: 1, clientCapabilities: this.#capabilities };
      if (input.handshakeTimeoutMs !== undefined) spec.handshakeTimeoutMs = input.handshakeTimeoutMs;
    } else if (input.handshakeTimeoutMs !== undefined) {
      throw new LeashError(`ensureSession: this daemon has no handshake deadline (feature ensure.handshake); upgrade leash or drop handshakeTimeoutMs`, { code: 'unsupported' });
    }
    const ensured = await this.#client.ensure(sessionKey, spec, opts);
    const known = this.#open.get(sessionKey);
    if (!ensured.created && known && known.leaseId === ensured.leaseId && !known.acp.ended) {
      if (!input.resumeSessionId || input.resumeSessionId === known.handle.backendSessionId) return known.handle;
    }
    if (known) known.acp.close();
    this.#open.delete(sessionKey);

    const acp = await this.#client.acp(sessionKey, opts);
    try {
      let backendSessionId = null;
      let sessionCwd = cwd;
      if (!ensured.created) {
        // Running already (an earlier process of the gateway started it): its stdio is the
        // same ACP connection, initialised then; reuse the ACP session the daemon recorded.
        const st = await this.#client.status(opts);
        const live = st.daemon.sessions.find((s) => s.sessionKey === sessionKey);
        const recorded = live?.acpSessions ?? [];
        const rec = input.resumeSessionId
          ? recorded.find((a) => a.sessionId === input.resumeSessionId)
          : recorded.length === 1 ? recorded[0] : null;
        if (rec) {
          backendSessionId = rec.sessionId;
          sessionCwd = rec.cwd ?? cwd;
        }
      }
      if (!backendSessionId) {
        // A new adapter answered the daemon's initialize (the ensure's reply); one found running
        // was initialised when it started, and is asked again only for its capabilities.
        const init = ensured.created && ensured.initialize
          ? initResult(ensured.initialize, sessionKey)
          : await acp.request('initialize', { protocolVersion: 1, clientCapabilities: this.#capabilities }, opts);
        if (input.resumeSessionId) {
          const target = input.resumeSessionId;
          if (!init?.agentCapabilities?.loadSession) {
            throw new ResumeError(`ensureSession ${sessionKey}: the agent has no loadSession capability, so ACP session ${target} cannot be resumed`, {
              reason: 'load_unsupported',
              data: { session: sessionKey, acpSessionId: target, ensured },
            });
          }
          try {
            await acp.request('session/load', { sessionId: target, cwd, mcpServers }, opts);
          } catch (e) {
            if (!(e instanceof AcpError)) throw e;
            throw new ResumeError(`ensureSession ${sessionKey}: session/load of ${target} failed: ${e.message}`, {
              reason: 'load_failed',
              cause: e,
              data: { session: sessionKey, acpSessionId: target, ensured, rpcCode: e.rpcCode },
            });
          }
          backendSessionId = target;
        } else {
          backendSessionId = (await acp.request('session/new', { cwd, mcpServers }, opts)).sessionId;
        }
      }
      const handle = {
        sessionKey,
        backend: 'acpx',
        runtimeSessionName: sessionKey,
        cwd: sessionCwd,
        backendSessionId,
        leaseId: ensured.leaseId,
        rootPid: ensured.rootPid,
      };
      this.#open.set(sessionKey, { handle, acp, leaseId: ensured.leaseId });
      return handle;
    } catch (e) {
      acp.close();
      throw e;
    }
  }

  /** The ACP channel of a session this controller ensured (for prompts, permission requests). */
  channel(handle) {
    const s = this.#open.get(handle.sessionKey);
    if (!s) throw new NotFoundError(`no open session ${handle.sessionKey} on this controller (ensure it first)`);
    return s.acp;
  }

  /** Runs one turn (`session/prompt`) and resolves with the agent's response (its stopReason). */
  prompt(handle, text, opts = {}) {
    return this.channel(handle).request('session/prompt', { sessionId: handle.backendSessionId, prompt: [{ type: 'text', text }] }, opts);
  }

  /**
   * Cancels the running turn (`session/cancel` to the agent, through the daemon). Never ends
   * the adapter or the session: the handle stays usable.
   */
  async cancelTurn(handle, opts = {}) {
    const target = { session: handle.sessionKey };
    if (handle.backendSessionId) target.acpSessionId = handle.backendSessionId;
    await this.#client.cancel(target, opts);
  }

  /**
   * Closes the session: the daemon verifies the live tree against the lease, then terminates it
   * (TERM, grace, KILL). `discardPersistentState` also forgets its stored spec and its place on
   * the resumable list; `reason` is logged with the close. Resolves with the outcomes (none when
   * the session had no active lease); rejects with CloseRefusedError when ownership could not
   * be proven (nothing was signalled; the lease stays open).
   */
  async closeSession({ handle, discardPersistentState = false, reason } = {}, opts = {}) {
    if (!handle || typeof handle.sessionKey !== 'string') throw new TypeError('closeSession: handle.sessionKey must be a string');
    const known = this.#open.get(handle.sessionKey);
    this.#open.delete(handle.sessionKey);
    known?.acp.close();
    const target = { session: handle.sessionKey };
    if (discardPersistentState) target.discardPersistentState = true;
    if (reason !== undefined) target.reason = String(reason);
    let outcomes;
    try {
      outcomes = await this.#client.close(target, opts);
    } catch (e) {
      if (e instanceof NotFoundError) return [];
      throw e;
    }
    // The daemon answers once the tree is terminated; the session ends when its wrapper is
    // reaped, a moment later. Resolving only then lets the gateway ensure the key again at once.
    const ending = new Set(outcomes.filter((o) => o.result === 'closed' || o.result === 'lost').map((o) => o.leaseId));
    if (ending.size > 0) await this.#ended(ending, opts);
    const refused = outcomes.filter((o) => o.result === 'leftOpen');
    if (refused.length > 0) {
      throw new CloseRefusedError(`closeSession ${handle.sessionKey}: ownership of the live tree could not be proven, nothing was signalled: ${refused.map((o) => o.reason).join('; ')}`, {
        data: { outcomes },
      });
    }
    return outcomes;
  }

  /** Resolves once no daemon session of these leases is still there and not ended. */
  async #ended(leaseIds, opts) {
    const deadline = Date.now() + (opts.timeoutMs ?? 30_000);
    for (;;) {
      const st = await this.#client.status(opts);
      if (!st.daemon.sessions.some((s) => leaseIds.has(s.leaseId) && s.phase !== 'ended')) return;
      if (Date.now() > deadline) return;
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /**
   * The startup reap: from the open leases of the state root (never a scan for ACP-looking
   * commands), each verified before any signal. Resolves with the daemon's report.
   */
  reapStartupOrphans(opts = {}) {
    return this.#client.reap(opts.dryRun ? { dryRun: true } : {}, opts);
  }

  /**
   * The lease's live process tree when the daemon proves it is the lease's own (pid, start time,
   * pidfs inode, wrapper path, markers, command hash), else null: gone, not ours, or not
   * provable (an unreadable process table). A lease record whose rootPid disagrees with leash's
   * row is not ours either.
   */
  async verifyOwnedTree(lease, opts = {}) {
    const leaseId = typeof lease === 'string' ? lease : lease?.leaseId;
    if (typeof leaseId !== 'string' || leaseId === '') throw new TypeError('verifyOwnedTree: lease.leaseId must be a string');
    let v;
    try {
      v = await this.#client.verify({ lease: leaseId }, opts);
    } catch (e) {
      if (e instanceof NotFoundError) return null;
      throw e;
    }
    if (v?.answer !== 'owned') return null;
    if (typeof lease === 'object' && lease.rootPid && v.rootPid !== lease.rootPid) return null;
    return {
      leaseId: v.leaseId,
      sessionKey: v.sessionKey,
      rootPid: v.rootPid,
      rootStartTime: v.rootStartTime,
      members: v.members ?? [],
      evidence: v.evidence ?? [],
    };
  }

  /** Detaches from the sessions (they keep running) and closes the connection if it owns it. */
  async disconnect() {
    for (const s of this.#open.values()) s.acp.close();
    this.#open.clear();
    if (this.#ownsClient) await this.#client.disconnect();
  }
}
