'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const util = require('node:util')
const kf = require('..')

test('setup, keygen, encrypt, decrypt round trip (promises)', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  assert.ok(publicKey instanceof kf.abe.PublicKey)
  assert.ok(masterKey instanceof kf.abe.MasterKey)
  const key = await kf.abe.keygen(masterKey, { country: 'FR', region: 'EU' })
  assert.ok(key instanceof kf.abe.AttributeKey)
  assert.deepEqual([...key.labels].sort(), ['country', 'region'])
  const ct = await kf.abe.encrypt(publicKey, 'region: EU', Buffer.from('hello'))
  assert.ok(Buffer.isBuffer(ct))
  assert.equal((await kf.abe.decrypt(key, ct)).toString(), 'hello')
  assert.equal(kf.abe.policyOf(ct), 'region: EU')
  assert.equal(kf.abe.couldDecrypt({ region: 'EU' }, ct), true)
  assert.equal(kf.abe.couldDecrypt({ region: 'US' }, ct), false)
  // Uint8Array works as well as Buffer.
  const ct2 = await kf.abe.encrypt(publicKey, 'country: FR', new Uint8Array([1, 2, 3]))
  assert.deepEqual([...(await kf.abe.decrypt(key, ct2))], [1, 2, 3])
})

test('sync twins give the same results', () => {
  const { publicKey, masterKey } = kf.abe.setupSync()
  const key = kf.abe.keygenSync(masterKey, { region: 'EU' })
  const ct = kf.abe.encryptSync(publicKey, 'region: EU or country: US', Buffer.from('sync'))
  assert.equal(kf.abe.decryptSync(key, ct).toString(), 'sync')
})

test('keys round-trip through bytes', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  const pk = kf.abe.PublicKey.fromBytes(publicKey.toBytes())
  const msk = kf.abe.MasterKey.fromBytes(masterKey.toBytes())
  const key = kf.abe.AttributeKey.fromBytes((await kf.abe.keygen(msk, { a: 'b' })).toBytes())
  const ct = await kf.abe.encrypt(pk, 'a: b', Buffer.from('x'))
  assert.equal((await kf.abe.decrypt(key, ct)).toString(), 'x')
  assert.deepEqual(pk.toBytes(), publicKey.toBytes())
})

test('errors: not satisfied, tampered, malformed, policy syntax', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  const key = await kf.abe.keygen(masterKey, { region: 'US' })
  const ct = await kf.abe.encrypt(publicKey, 'region: EU', Buffer.from('secret'))
  await assert.rejects(kf.abe.decrypt(key, ct), (e) => e instanceof kf.KeyfenceError && e.code === 'POLICY_NOT_SATISFIED')
  assert.throws(() => kf.abe.decryptSync(key, ct), { code: 'POLICY_NOT_SATISFIED' })

  const eu = await kf.abe.keygen(masterKey, { region: 'EU' })
  const tampered = Buffer.from(ct)
  tampered[tampered.length - 1] ^= 1
  await assert.rejects(kf.abe.decrypt(eu, tampered), { code: 'INVALID_CIPHERTEXT' })
  await assert.rejects(kf.abe.decrypt(eu, ct.subarray(0, 40)), { code: 'INVALID_CIPHERTEXT' })
  await assert.rejects(kf.abe.decrypt(eu, Buffer.alloc(0)), { code: 'INVALID_CIPHERTEXT' })
  assert.throws(() => kf.abe.policyOf(Buffer.from('nope')), { code: 'INVALID_CIPHERTEXT' })

  // Another authority's key: the integrity check fails.
  const other = await kf.abe.setup()
  const foreign = await kf.abe.keygen(other.masterKey, { region: 'EU' })
  await assert.rejects(kf.abe.decrypt(foreign, ct), { code: 'INVALID_CIPHERTEXT' })

  await assert.rejects(kf.abe.encrypt(publicKey, 'region: EU and', Buffer.from('x')), { code: 'POLICY_SYNTAX', position: 14 })
  await assert.rejects(kf.abe.keygen(masterKey, { region: '' }), { code: 'INVALID_ATTRIBUTES' })
  assert.throws(() => kf.abe.PublicKey.fromBytes(Buffer.from('junk')), { code: 'INVALID_KEY' })
  assert.throws(() => kf.abe.MasterKey.fromBytes(Buffer.alloc(10)), { code: 'INVALID_KEY' })
  assert.throws(() => kf.abe.AttributeKey.fromBytes(Buffer.alloc(3)), { code: 'INVALID_KEY' })
})

test('keygen refuses attributes that overflow the key format', async () => {
  const { masterKey } = await kf.abe.setup()
  const many = Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`${i}`, 'x']))
  await assert.rejects(kf.abe.keygen(masterKey, many), { code: 'LIMIT_EXCEEDED' })
})

test('secrets never show in util.inspect', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  const key = await kf.abe.keygen(masterKey, { region: 'EU' })
  const hex = (b) => Buffer.from(b).toString('hex').slice(0, 16)
  for (const [obj, bytes] of [[masterKey, masterKey.toBytes()], [key, key.toBytes()]]) {
    const shown = util.inspect(obj, { depth: 10, showHidden: true })
    assert.doesNotMatch(shown, new RegExp(hex(bytes.subarray(8))))
    assert.match(shown, /not shown/)
  }
  assert.match(util.inspect(key), /AttributeKey .*region/)
  assert.match(util.inspect(publicKey), /PublicKey/)
})

test('classes cannot be constructed without bytes', () => {
  assert.throws(() => new kf.abe.MasterKey(), Error)
})
