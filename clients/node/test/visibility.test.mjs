// canSeeSessionRow against the shared visibility table (fixtures/visibility/matrix.json), the
// same table tests/visibility_matrix.rs checks leash's own check and its four sessions
// operations against: a case on which the port and leash disagree fails here or there.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as leash from '../src/index.js';
import { repoRoot } from './helpers.mjs';

const table = JSON.parse(readFileSync(join(repoRoot, 'fixtures/visibility/matrix.json'), 'utf8'));

test('the matrix: every visibility x a2a policy x sandboxed x row kind', () => {
  const rows = table.rows;
  let cells = 0;
  const failures = [];
  assert.equal(table.matrix.length, 24);
  for (const m of table.matrix) {
    const marks = m.expect.split(/\s+/);
    assert.equal(marks.length, rows.length);
    rows.forEach((row, i) => {
      cells++;
      const want = marks[i] === 'Y';
      const got = leash.canSeeSessionRow({
        row,
        rows,
        requesterSessionKey: table.requester,
        visibility: m.visibility,
        a2aPolicy: table.a2a[m.a2a],
        sandboxed: m.sandboxed,
      });
      if (got !== want) failures.push(`visibility ${m.visibility}, a2a ${m.a2a}, sandboxed ${m.sandboxed}, ${row.kind}: expected ${want}, got ${got}`);
    });
  }
  assert.equal(cells, 24 * 8);
  assert.deepEqual(failures, []);
});

test('the single cases: directional and wildcard rules, unknown agents, keys, tree edges, cycles', () => {
  assert.ok(table.cases.length >= 20);
  const failures = [];
  for (const c of table.cases) {
    const row = c.rows.find((r) => r.sessionKey === c.row);
    assert.ok(row, `${c.name}: its row is missing`);
    const input = { row, rows: c.rows, requesterSessionKey: c.requester, visibility: c.visibility, a2aPolicy: c.a2a, sandboxed: c.sandboxed };
    const grant = leash.sessionRowGrant(input);
    const visible = leash.canSeeSessionRow(input);
    if (visible !== c.visible || grant !== c.grant) failures.push(`${c.name}: expected ${c.grant}, got ${grant}`);
  }
  assert.deepEqual(failures, []);
});

test('bad policies and visibilities are refused, as leash refuses them', () => {
  const row = { sessionKey: 'agent:main:a' };
  const base = { row, requesterSessionKey: 'agent:main:b', visibility: 'all' };
  for (const rule of ['main', 'main:', ':codex', 'a:b:c', 'ma in:codex']) {
    assert.throws(() => leash.canSeeSessionRow({ ...base, a2aPolicy: { mode: 'on', rules: [rule] } }), TypeError, rule);
  }
  assert.throws(() => leash.canSeeSessionRow({ ...base, visibility: 'everything' }), TypeError);
  assert.throws(() => leash.canSeeSessionRow({ ...base, a2aPolicy: { mode: 'maybe' } }), TypeError);
  // The shorthands.
  assert.equal(leash.canSeeSessionRow({ ...base, row: { sessionKey: 'agent:codex:c' }, a2aPolicy: 'on' }), true);
  assert.equal(leash.canSeeSessionRow({ ...base, row: { sessionKey: 'agent:codex:c' }, a2aPolicy: 'off' }), false);
  // Without rows, only the row's own fields can name the requester.
  const child = { sessionKey: 'acp:k', agentId: 'claude', spawnedBy: 'agent:main:b' };
  assert.equal(leash.canSeeSessionRow({ ...base, row: child, visibility: 'tree' }), true);
});
