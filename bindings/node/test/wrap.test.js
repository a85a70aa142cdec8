'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const util = require('node:util')
const kf = require('..')

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-'))

test('authority and machine: wrap, open, rotate', async (t) => {
  const dir = tmp()
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const auth = await kf.wrap.Authority.init(dir)
  assert.ok(auth instanceof kf.wrap.Authority)
  const env = await auth.wrap('region: EU', Buffer.from('-----BEGIN PRIVATE KEY-----'))
  const machineKey = await auth.issue({ region: 'EU', country: 'DE' })
  const m = new kf.wrap.Machine(machineKey, dir)
  assert.ok(m instanceof kf.wrap.Machine)
  assert.equal(m.couldOpen(env), true)
  assert.equal((await m.open(env)).toString(), '-----BEGIN PRIVATE KEY-----')
  assert.equal(m.openSync(env).toString(), '-----BEGIN PRIVATE KEY-----')

  const r = await auth.rotateMaster()
  assert.equal(r.resealed, 1)
  assert.equal(r.generation, 2)
  // Envelopes are untouched: the old machine key still opens them.
  assert.equal((await new kf.wrap.Machine(machineKey, dir).open(env)).toString(), '-----BEGIN PRIVATE KEY-----')

  const reopened = await kf.wrap.Authority.open(dir)
  const env2 = await reopened.wrap('country: DE', Buffer.from('two'))
  const fresh = new kf.wrap.Machine(await reopened.issue({ country: 'DE' }), dir)
  assert.equal((await fresh.open(env2)).toString(), 'two')
  assert.match(util.inspect(fresh), /Machine .*country/)
  assert.doesNotMatch(util.inspect(auth, { showHidden: true }), /[0-9a-f]{32}/)
})

test('sync twins', (t) => {
  const dir = tmp()
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const auth = kf.wrap.Authority.initSync(dir)
  const env = auth.wrapSync('a: 1', Buffer.from('s'))
  const m = new kf.wrap.Machine(auth.issueSync({ a: '1' }), dir)
  assert.equal(m.openSync(env).toString(), 's')
  assert.equal(auth.rotateMasterSync().resealed, 1)
  assert.ok(kf.wrap.Authority.openSync(dir) instanceof kf.wrap.Authority)
})

test('errors', async (t) => {
  const dir = tmp()
  const empty = tmp()
  t.after(() => {
    fs.rmSync(dir, { recursive: true, force: true })
    fs.rmSync(empty, { recursive: true, force: true })
  })
  const auth = await kf.wrap.Authority.init(dir)
  await assert.rejects(kf.wrap.Authority.init(dir), { code: 'AUTHORITY_EXISTS' })
  // Opening never creates a store: a directory without one, or a typo,
  // is STORE_IO saying so, and nothing is made.
  await assert.rejects(kf.wrap.Authority.open(empty), { code: 'STORE_IO', message: /is not a keyfence store/ })
  assert.throws(() => kf.wrap.Authority.openSync(path.join(empty, 'typo')), { code: 'STORE_IO' })
  assert.equal(fs.existsSync(path.join(empty, 'typo')), false)
  // A store inside another is refused, with nothing made.
  await assert.rejects(kf.wrap.Authority.init(path.join(dir, 'sealed', 'in')), { code: 'INVALID_ARGUMENT', message: /lies inside the keyfence store/ })
  assert.equal(fs.existsSync(path.join(dir, 'sealed', 'in')), false)
  await assert.rejects(auth.wrap('a: b or', Buffer.from('x')), (e) => e instanceof kf.KeyfenceError && e.code === 'POLICY_SYNTAX' && e.position === 7)
  await assert.rejects(auth.issue({ a: '' }), { code: 'INVALID_ATTRIBUTES' })

  const env = await auth.wrap('region: EU', Buffer.from('x'))
  const us = new kf.wrap.Machine(await auth.issue({ region: 'US' }), dir)
  assert.equal(us.couldOpen(env), false)
  await assert.rejects(us.open(env), { code: 'POLICY_NOT_SATISFIED' })
  const tampered = Buffer.from(env)
  tampered[tampered.length - 1] ^= 1
  const eu = new kf.wrap.Machine(await auth.issue({ region: 'EU' }), dir)
  await assert.rejects(eu.open(tampered), { code: 'INVALID_ENVELOPE' })
  await assert.rejects(eu.open(Buffer.from('not an envelope')), { code: 'INVALID_ENVELOPE' })
  assert.throws(() => eu.couldOpen(Buffer.alloc(3)), { code: 'INVALID_ENVELOPE' })
  assert.throws(() => new kf.wrap.Machine(Buffer.from('junk'), dir), { code: 'INVALID_KEY' })
})

test('revoking a machine: its cached policy key opens nothing the store serves', async (t) => {
  const dir = tmp()
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const auth = await kf.wrap.Authority.init(dir)
  const handed = await auth.wrap('region: EU', Buffer.from('customer secret'))
  const thief = new kf.wrap.Machine(await auth.issue({ region: 'EU' }), dir)
  const peer = new kf.wrap.Machine(auth.issueSync({ region: 'EU' }), dir)
  assert.match(thief.id, /^[0-9a-f]{32}$/)
  assert.notEqual(thief.id, peer.id)
  assert.equal((await thief.open(handed)).toString(), 'customer secret') // cached now
  const r = await auth.revoke(thief.id)
  assert.deepEqual([r.id, r.already, r.rekeyed, r.rewrapped, r.retired], [thief.id, false, 1, 1, 1])
  assert.equal(auth.revokeSync(thief.id).already, true)
  const [name] = fs.readdirSync(path.join(dir, 'envelopes'))
  const served = fs.readFileSync(path.join(dir, 'envelopes', name))
  await assert.rejects(thief.open(served), { code: 'MACHINE_REVOKED' })
  assert.equal((await peer.open(served)).toString(), 'customer secret')
  await assert.rejects(auth.issue({ region: 'EU', machine: thief.id }), { code: 'MACHINE_REVOKED' })
  await assert.rejects(auth.revoke('not an id'), { code: 'INVALID_ATTRIBUTES' })
})
