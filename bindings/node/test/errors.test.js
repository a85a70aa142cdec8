'use strict'
// Arguments of the wrong type, and malformed bytes, throw a clear
// KeyfenceError; nothing aborts the process.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const kf = require('..')

const invalid = (e) => e instanceof kf.KeyfenceError && e.code === 'INVALID_ARGUMENT' && e.message.length > 20

test('wrong JavaScript types are INVALID_ARGUMENT', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  const key = await kf.abe.keygen(masterKey, { a: 'b' })
  assert.throws(() => kf.policy.check(42, {}), invalid)
  assert.throws(() => kf.policy.check('a: b'), invalid)
  assert.throws(() => kf.policy.check('a: b', { a: 1 }), invalid)
  assert.throws(() => kf.abe.encrypt(publicKey, 'a: b', 'not bytes'), invalid)
  assert.throws(() => kf.abe.encrypt(masterKey, 'a: b', Buffer.from('x')), invalid)
  assert.throws(() => kf.abe.decrypt({}, Buffer.from('x')), invalid)
  assert.throws(() => kf.abe.decryptSync(key, null), invalid)
  assert.throws(() => kf.abe.keygen(publicKey, { a: 'b' }), invalid)
  assert.throws(() => kf.abe.PublicKey.fromBytes('abc'), invalid)
  assert.throws(() => new kf.wrap.Machine(123, '/tmp'), invalid)
  assert.throws(() => kf.wrap.Authority.init(undefined), invalid)
  assert.throws(() => new kf.sign.Engine({ ec: { threads: 'many' } }), invalid)
  const engine = new kf.sign.Engine()
  const pem = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' })
  const sk = kf.sign.PrivateKey.fromPem(pem)
  assert.throws(() => engine.sign('key', 'ecdsa-p256-sha256', Buffer.from('x')), invalid)
  assert.throws(() => engine.sign(sk, 5, Buffer.from('x')), invalid)
  assert.throws(() => engine.sign(sk, 'ecdsa-p256-sha256', 'text'), invalid)
  assert.throws(() => kf.sign.PrivateKey.fromPem(7), invalid)
  // A method called on the wrong object.
  assert.throws(() => kf.sign.Engine.prototype.metrics.call({}), invalid)
  engine.close()
})

test('malformed buffers of every size never abort', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  const key = await kf.abe.keygen(masterKey, { a: 'b' })
  const ct = await kf.abe.encrypt(publicKey, 'a: b', Buffer.from('x'))
  for (let n = 0; n < ct.length; n += 7) {
    await assert.rejects(kf.abe.decrypt(key, ct.subarray(0, n)), { code: 'INVALID_CIPHERTEXT' })
  }
  for (let i = 0; i < 30; i++) {
    const junk = crypto.randomBytes(i * 13)
    assert.throws(() => kf.abe.AttributeKey.fromBytes(junk), { code: 'INVALID_KEY' })
    assert.throws(() => kf.abe.PublicKey.fromBytes(junk), { code: 'INVALID_KEY' })
    assert.throws(() => kf.sign.PrivateKey.fromPem(junk), { code: 'INVALID_PRIVATE_KEY' })
  }
})
