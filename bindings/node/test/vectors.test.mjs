// Every vector of vectors/shared.kfv (format: vectors/README.md), the file
// the Rust, C and Python tests run too: the same answers, the same codes.
import test from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

const kf = createRequire(import.meta.url)('..')
const text = readFileSync(new URL('../../../vectors/shared.kfv', import.meta.url), 'utf8')

function parse(src) {
  const vectors = []
  let cur = null
  for (const line of src.split('\n')) {
    if (line.startsWith('#')) continue
    if (line === '') {
      cur = null
      continue
    }
    const i = line.indexOf(': ')
    const [key, value] = i < 0 ? [line.replace(/:$/, ''), ''] : [line.slice(0, i), line.slice(i + 2)]
    if (!cur) vectors.push((cur = { attribute: [] }))
    if (key === 'attribute') cur.attribute.push(value)
    else cur[key] = value
  }
  return vectors
}

const attrs = (list) => Object.fromEntries(list.map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]))
const hex = (h) => Buffer.from(h, 'hex')

/** Runs `f`; the outcome as the file spells it: a value, or `error NAME`. */
async function outcome(f) {
  try {
    return { value: await f() }
  } catch (e) {
    assert.ok(e instanceof kf.KeyfenceError, `not a KeyfenceError: ${e}`)
    return { error: e.code, position: e.position }
  }
}

function check(v, got, expectValue) {
  if (v.expect.startsWith('error ')) {
    assert.equal(got.error, v.expect.slice(6), v.name)
    if (v.position !== undefined) assert.equal(got.position, Number(v.position), v.name)
  } else {
    assert.equal(got.error, undefined, `${v.name}: ${got.error}`)
    expectValue(got.value)
  }
}

const kinds = {
  'policy-check': async (v) => {
    const got = await outcome(() => kf.policy.check(v.policy, attrs(v.attribute)))
    check(v, got, (value) => assert.equal(String(value), v.expect, v.name))
  },
  'policy-canonical': async (v) => {
    const got = await outcome(() => kf.policy.canonical(v.policy))
    check(v, got, (value) => assert.equal(value, v.canonical, v.name))
  },
  'abe-key': async (v) => {
    const cls = { 'public-key': kf.abe.PublicKey, 'master-key': kf.abe.MasterKey, 'attribute-key': kf.abe.AttributeKey }[v.object]
    assert.ok(cls, `${v.name}: unknown object ${v.object}`)
    const got = await outcome(() => cls.fromBytes(hex(v.bytes)))
    check(v, got, (key) => assert.deepEqual(key.toBytes(), hex(v.bytes), v.name))
  },
  'abe-decrypt': async (v) => {
    kf.abe.PublicKey.fromBytes(hex(v.public_key))
    const key = kf.abe.AttributeKey.fromBytes(hex(v.attribute_key))
    const ct = hex(v.ciphertext)
    const got = await outcome(() => kf.abe.decrypt(key, ct))
    check(v, got, (pt) => assert.deepEqual(pt, hex(v.plaintext), v.name))
    if (v.policy_of !== undefined) assert.equal(kf.abe.policyOf(ct), v.policy_of, v.name)
    if (v.could_decrypt !== undefined) assert.equal(String(kf.abe.couldDecrypt(attrs(v.attribute), ct)), v.could_decrypt, v.name)
  },
}

const vectors = parse(text)

test('the file has vectors of every kind', () => {
  assert.ok(vectors.length >= 30)
  for (const kind of Object.keys(kinds)) assert.ok(vectors.some((v) => v.kind === kind), kind)
})

for (const v of vectors) {
  test(`${v.kind}: ${v.name}`, async () => {
    assert.ok(kinds[v.kind], `unknown kind ${v.kind}`)
    await kinds[v.kind](v)
  })
}
