// The design's `canSeeSessionRow`: may a requester see a session row? A pure check over row
// metadata, a port of leash's own (core/src/visibility.rs, `can_see_session_row`), checked
// against the same fixture table (fixtures/visibility/matrix.json) in both test suites, so the
// gateway's answer and the daemon's `sessions` answer never differ. The rules:
//
// - The requester's own session is visible under every visibility.
// - `self`: nothing else. `tree`: rows the requester owns or that were spawned from it,
//   transitively (a row points at the sessions it belongs to through `ownerSessionKey`,
//   `spawnedBy` and `parentSessionKey`). `agent`: rows of the requester's agent, plus its tree.
//   `all`: those, plus cross-agent rows the a2a policy allows.
// - A sandboxed requester is clamped to `tree` (`self` stays `self`).
// - A row's agent is its `agentId`, else the agent its key names (`agent:<id>:<rest>`), else
//   unknown; the requester's likewise (from its row when `rows` has one, else its key). An
//   unknown agent is nobody's "same agent"; under `all` only a bare `*` pattern (or a policy
//   without rules) matches it. An empty string means not recorded, like null.
// - a2a rules are directional (`FROM:TO`: requesters of agent FROM may see rows of agent TO),
//   with `*` wildcards, case-sensitive.
//
// The tree is derived from the rows the caller passes (`rows`, the rows it already loaded);
// without them only the row's own fields can name the requester (direct ownership).

const ORDER = { self: 0, tree: 1, agent: 2, all: 3 };

const present = (v) => (typeof v === 'string' && v !== '' ? v : null);

/** The agent a gateway-style session key names (`agent:<id>:<rest>`), else null. */
export function agentFromKey(key) {
  if (typeof key !== 'string' || !key.startsWith('agent:')) return null;
  const rest = key.slice('agent:'.length);
  const i = rest.indexOf(':');
  if (i <= 0 || i === rest.length - 1) return null;
  return rest.slice(0, i);
}

/** A row's agent: `agentId`, else the one its key names, else null (unknown). */
export function rowAgent(row) {
  return present(row.agentId) ?? agentFromKey(row.sessionKey);
}

/** The sessions a row says it belongs to (owner, spawner, parent), without repeats or itself. */
function belongsTo(row) {
  const o = present(row.ownerSessionKey);
  const s = present(row.spawnedBy);
  const p = present(row.parentSessionKey);
  const out = [];
  if (o !== null) out.push(o);
  if (s !== null && s !== o) out.push(s);
  if (p !== null && p !== o && p !== s) out.push(p);
  return out.filter((k) => k !== row.sessionKey);
}

function parseVisibility(v) {
  if (typeof v === 'string' && Object.hasOwn(ORDER, v)) return v;
  throw new TypeError(`unknown visibility '${v}' (expected self, tree, agent or all)`);
}

function checkPattern(p, rule) {
  if (typeof p !== 'string' || p === '' || p.includes(':') || /\s/u.test(p)) {
    throw new TypeError(`a2a rule '${rule}' is not FROM:TO (agent ids or patterns with *, e.g. main:codex or main:*)`);
  }
  return p;
}

/** `FROM:TO` as {from, to}; a TypeError for anything else (as leash refuses it). */
export function parseA2aRule(rule) {
  const text = String(rule);
  const i = text.indexOf(':');
  if (i < 0) checkPattern('', text);
  return { from: checkPattern(text.slice(0, i), text), to: checkPattern(text.slice(i + 1), text) };
}

/**
 * An a2a policy as leash writes it (`{mode: 'off'}`, `{mode: 'on', rules: ['main:codex']}`, no
 * rules meaning every pair), or the shorthands 'off' / 'on'.
 */
function parsePolicy(a2a) {
  if (a2a === undefined || a2a === null || a2a === 'off') return null;
  if (a2a === 'on') return [];
  if (typeof a2a === 'object' && a2a.mode === 'off') return null;
  if (typeof a2a === 'object' && a2a.mode === 'on') return (a2a.rules ?? []).map(parseA2aRule);
  throw new TypeError(`a2aPolicy must be {mode: 'off'} or {mode: 'on', rules?: ['FROM:TO', ...]}, not ${JSON.stringify(a2a)}`);
}

/** `*`-only glob (the same algorithm as leash's: one backtrack point). */
function glob(pattern, text) {
  const p = [...pattern];
  const t = [...text];
  let pi = 0;
  let ti = 0;
  let star = null;
  while (ti < t.length) {
    if (pi < p.length && p[pi] === '*') {
      star = [pi, ti];
      pi++;
    } else if (pi < p.length && p[pi] === t[ti]) {
      pi++;
      ti++;
    } else if (star) {
      pi = star[0] + 1;
      ti = star[1] + 1;
      star = [star[0], star[1] + 1];
    } else return false;
  }
  return p.slice(pi).every((c) => c === '*');
}

const matches = (pattern, agent) => pattern === '*' || (agent !== null && glob(pattern, agent));

function allows(rules, from, to) {
  if (rules === null) return false;
  if (rules.length === 0) return true;
  return rules.some((r) => matches(r.from, from) && matches(r.to, to));
}

/** The requester as `rows` describe it: its agent and the keys of its tree. */
export function sessionRequester(requesterSessionKey, rows = []) {
  const byKey = new Map();
  for (const r of rows) byKey.set(r.sessionKey, r);
  const members = new Map();
  for (const r of byKey.values()) {
    for (const up of belongsTo(r)) {
      if (!members.has(up)) members.set(up, []);
      members.get(up).push(r.sessionKey);
    }
  }
  const own = byKey.get(requesterSessionKey);
  const agent = own ? rowAgent(own) : agentFromKey(requesterSessionKey);
  const tree = new Set();
  const stack = [requesterSessionKey];
  while (stack.length > 0) {
    const k = stack.pop();
    for (const m of members.get(k) ?? []) {
      if (m !== requesterSessionKey && !tree.has(m)) {
        tree.add(m);
        stack.push(m);
      }
    }
  }
  return { key: requesterSessionKey, agent, tree };
}

/**
 * Why the row is visible — 'requester', 'owned', 'same agent' or 'a2a' (leash's `visibleAs`
 * wording) — or null when it is not.
 */
export function sessionRowGrant({ row, requesterSessionKey, visibility, a2aPolicy, sandboxed = false, rows, requester }) {
  if (!row || typeof row.sessionKey !== 'string') throw new TypeError('canSeeSessionRow: row.sessionKey must be a string');
  let v = parseVisibility(visibility);
  const rules = parsePolicy(a2aPolicy);
  const req = requester ?? sessionRequester(requesterSessionKey, rows ?? [row]);
  if (row.sessionKey === req.key) return 'requester';
  if (sandboxed && ORDER[v] > ORDER.tree) v = 'tree';
  if (v === 'self') return null;
  // Before the agent rules, so that `agent` and `all` never hide what `tree` shows.
  const owned = req.tree.has(row.sessionKey) || belongsTo(row).some((k) => k === req.key || req.tree.has(k));
  if (owned) return 'owned';
  if (v === 'tree') return null;
  const agent = rowAgent(row);
  if (req.agent !== null && agent !== null && req.agent === agent) return 'same agent';
  if (v === 'all' && allows(rules, req.agent, agent)) return 'a2a';
  return null;
}

/**
 * The design's `canSeeSessionRow({ row, requesterSessionKey, visibility, a2aPolicy })`, with
 * `sandboxed` (default false) and `rows` (the rows the caller loaded, for the requester's
 * agent and its transitive tree; default just `row`).
 */
export function canSeeSessionRow(input) {
  return sessionRowGrant(input) !== null;
}
