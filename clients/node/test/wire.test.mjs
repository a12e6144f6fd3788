// The connection's line decoder (src/wire.js) against `JSON.parse`: whatever path a line takes
// (the direct build of plain output/stderr items or the JSON parser), the caller gets the same
// value, in the same order, whatever the chunking of the bytes; a line that is not JSON is
// reported as bad and the lines around it still arrive. Also the request line the client writes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LineDecoder } from '../src/wire.js';

const LINES = [
  '{"id":2,"seq":7,"type":"output","line":"hello"}',
  '{"id":2,"seq":8,"type":"output","line":""}',
  '{"id":2,"seq":9,"type":"stderr","line":"warn: x"}',
  // Escapes, non-ASCII text (two-, three- and four-byte UTF-8), extra fields.
  '{"id":2,"seq":10,"type":"output","line":"{\\"jsonrpc\\":\\"2.0\\",\\"id\\":1}"}',
  '{"id":2,"seq":11,"type":"output","line":"a\\\\b"}',
  '{"id":2,"seq":12,"type":"output","line":"é ü € 𝄞 日本"}',
  '{"id":2,"seq":13,"type":"output","line":"bad \\ufffd byte","lossy":true}',
  '{"id":2,"seq":14,"type":"output","line":"cut","truncated":true}',
  // Shapes that must take the parser: other types, replies, ids that are not plain integers.
  '{"id":2,"seq":15,"type":"event","kind":"spawned","leaseId":"x","detail":null,"at":1}',
  '{"id":2,"type":"end","reason":"ended","lastSeq":15}',
  '{"id":3,"ok":true,"result":{"sessionKey":"s","bytes":3,"busy":false}}',
  '{"id":"a","seq":16,"type":"output","line":"string id"}',
  '{"id":-1,"seq":17,"type":"output","line":"negative id"}',
  '{"id":1.5,"seq":19,"type":"output","line":"fraction"}',
  '{"id":12345678901234567890,"seq":20,"type":"output","line":"too long for a double"}',
  '{"id":2,"seq":21,"type":"output","line":"spaced" }',
  '{ "id":2,"seq":22,"type":"output","line":"spaced"}',
  '{"id":null,"ok":false,"error":{"code":"bad_json","message":"m"}}',
  '{"id":2,"seq":23,"type":"output","line":"' + 'x'.repeat(5000) + '"}',
  '{"id":2,"seq":24,"type":"output","line":"tab\\there"}',
  '{"id":2,"seq":25,"type":"output","line":"quote \\" inside"}',
  // Ends like a plain item but has another field (the string literal alone does not parse).
  '{"id":2,"seq":26,"type":"output","line":"a","x":"b"}',
  '{"id":2,"seq":27,"type":"output","line":"a\\\\","x":"\\\\"}',
  '{"id":2,"seq":28,"type":"output","line":"ends in a backslash \\\\"}',
  '{"id":2,"seq":29,"type":"output","line":"last"}',
];

function decodeAll(chunks) {
  const got = [];
  const bad = [];
  const d = new LineDecoder((m) => got.push(m), (text) => bad.push(text));
  for (const c of chunks) d.push(c);
  return { got, bad };
}

function chunked(buf, size) {
  const out = [];
  for (let i = 0; i < buf.length; i += size) out.push(buf.subarray(i, i + size));
  return out;
}

test('every line decodes to what JSON.parse gives, in order, whatever the chunking', () => {
  const want = LINES.map((l) => JSON.parse(l));
  const bytes = Buffer.from(LINES.join('\n') + '\n');
  for (const size of [1, 2, 3, 7, 16, 64, 100, 1000, 4096, bytes.length]) {
    const { got, bad } = decodeAll(chunked(bytes, size));
    assert.deepEqual(bad, [], `chunks of ${size}`);
    assert.deepEqual(got, want, `chunks of ${size}`);
    // Same keys in the same order as the parser's objects.
    assert.deepEqual(got.map((m) => Object.keys(m)), want.map((m) => Object.keys(m)), `chunks of ${size}`);
  }
});

test('a plain output item built directly equals the parser\'s, and plain text skips the parser', () => {
  const plain = '{"id":42,"seq":9007199254740,"type":"output","line":"plain text"}';
  const escaped = '{"id":42,"seq":3,"type":"stderr","line":"{\\"a\\":[1,\\"\\u00e9\\"]}"}';
  const parse = JSON.parse;
  const parsed = [];
  JSON.parse = (text, ...rest) => {
    parsed.push(text);
    return parse(text, ...rest);
  };
  let got;
  try {
    got = decodeAll([Buffer.from(`${plain}\n${escaped}\n`)]).got;
  } finally {
    JSON.parse = parse;
  }
  assert.deepEqual(got, [parse(plain), parse(escaped)]);
  assert.equal(Object.getPrototypeOf(got[0]), Object.prototype);
  assert.equal(typeof got[0].id, 'number');
  // The plain line never reached the parser; the escaped one only as its string literal.
  assert.deepEqual(parsed, ['"{\\"a\\":[1,\\"\\u00e9\\"]}"']);
});

test('a line that is not JSON is reported and the next lines still arrive; blank lines are skipped', () => {
  // Also lines shaped like plain items that are not JSON (leading zeros, a trailing brace too
  // many) are not let through by the direct build.
  const notJson = ['not json', '{"id":2,"seq":1,"type":"output","line":"a"', '{"id":01,"seq":1,"type":"output","line":"a"}', '{"id":2,"seq":01,"type":"output","line":"a"}', '{"id":2,"seq":1,"type":"output","line":"a"}}'];
  const bytes = Buffer.from(`\n  \n{"id":2,"seq":1,"type":"output","line":"a"}\n${notJson.join('\n')}\n{"id":2,"seq":2,"type":"output","line":"b"}\n`);
  for (const size of [1, 5, bytes.length]) {
    const { got, bad } = decodeAll(chunked(bytes, size));
    assert.deepEqual(bad, notJson, `chunks of ${size}`);
    assert.deepEqual(got.map((m) => m.line), ['a', 'b'], `chunks of ${size}`);
  }
});

test('a partial line waits for its end; reset drops it', () => {
  const d = [];
  const dec = new LineDecoder((m) => d.push(m), () => assert.fail('no bad line'));
  dec.push(Buffer.from('{"id":2,"seq":1,"type":"out'));
  assert.equal(d.length, 0);
  dec.reset();
  dec.push(Buffer.from('{"id":2,"seq":2,"type":"output","line":"whole"}\n'));
  assert.deepEqual(d, [{ id: 2, seq: 2, type: 'output', line: 'whole' }]);
});

test('a multi-byte character split across chunks is decoded whole', () => {
  const line = Buffer.from('{"id":2,"seq":1,"type":"output","line":"€𝄞"}\n');
  const cut = line.indexOf(Buffer.from('€')) + 1;
  const { got } = decodeAll([line.subarray(0, cut), line.subarray(cut)]);
  assert.equal(got[0].line, '€𝄞');
});

test('a request line carries the same fields as the object it replaces, whatever the fields', async () => {
  const { LeashClient } = await import('../src/client.js');
  const spread = (id, op, fields) => JSON.parse(JSON.stringify({ ...fields, id, op }));
  const sorted = (o) => Object.fromEntries(Object.entries(o).sort(([a], [b]) => (a < b ? -1 : 1)));
  const cases = [{}, { session: 's', line: 'a"b\n\u2028' }, { id: 5 }, { op: 'x', a: 1 }, null, undefined, [1, 2], new Date(0), { a: undefined, b: 1 }, { toJSON: () => 1 }, Object.create(null)];
  for (const fields of cases) {
    const line = LeashClient.requestLine(7, 'send', fields);
    assert.ok(line.endsWith('\n') && !line.slice(0, -1).includes('\n'), JSON.stringify(line));
    assert.deepEqual(sorted(JSON.parse(line)), sorted(spread(7, 'send', fields)), `fields ${JSON.stringify(fields)}`);
  }
});
