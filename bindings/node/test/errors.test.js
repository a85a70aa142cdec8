'use strict'
// Arguments of the wrong type throw what Node's own APIs throw: a TypeError
// with code ERR_INVALID_ARG_TYPE that names the argument and what it
// accepts (as node:crypto does), never napi-rs's internals; malformed bytes
// throw a KeyfenceError; nothing aborts the process.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const kf = require('..')

/** A TypeError ERR_INVALID_ARG_TYPE naming `name` and saying what it takes. */
const argType = (name, accepts) => (e) => {
  assert.ok(e instanceof TypeError, `${e}`)
  assert.ok(!(e instanceof kf.KeyfenceError))
  assert.equal(e.code, 'ERR_INVALID_ARG_TYPE')
  assert.ok(e.message.includes(`"${name}"`), `${e.message} names ${name}`)
  if (accepts) assert.match(e.message, accepts)
  assert.doesNotMatch(e.message, /napi|Failed to|TypedArray from|recover/)
  return true
}
const BYTES = /must be an instance of Buffer, TypedArray, DataView, or ArrayBuffer/

test('wrong JavaScript types are TypeErrors that name the argument', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  const key = await kf.abe.keygen(masterKey, { a: 'b' })
  assert.throws(() => kf.policy.check(42, {}), argType('policy', /must be of type string\. Received type number \(42\)/))
  assert.throws(() => kf.policy.check('a: b'), argType('attrs', /Received undefined/))
  assert.throws(() => kf.policy.check('a: b', { a: 1 }), argType('attrs.a', /of type string/))
  assert.throws(() => kf.abe.encrypt(publicKey, 'a: b', 'not bytes'), argType('message', BYTES))
  assert.throws(() => kf.abe.encrypt(masterKey, 'a: b', Buffer.from('x')), argType('publicKey', /must be an instance of abe\.PublicKey\. Received an instance of MasterKey/))
  assert.throws(() => kf.abe.decrypt({}, Buffer.from('x')), argType('key', /abe\.AttributeKey/))
  assert.throws(() => kf.abe.decryptSync(key, null), argType('ciphertext', BYTES))
  assert.throws(() => kf.abe.keygen(publicKey, { a: 'b' }), argType('masterKey', /abe\.MasterKey/))
  assert.throws(() => kf.abe.PublicKey.fromBytes('abc'), argType('bytes', BYTES))
  assert.throws(() => new kf.wrap.Machine(123, '/tmp'), argType('machineKey', BYTES))
  assert.throws(() => kf.wrap.Authority.init(undefined), argType('dir', /of type string/))
  assert.throws(() => new kf.sign.Engine({ ec: { threads: 'many' } }), argType('options.ec.threads', /of type number/))
  const engine = new kf.sign.Engine()
  const pem = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' })
  const sk = kf.sign.PrivateKey.fromPem(pem)
  assert.throws(() => engine.sign('key', 'ecdsa-p256-sha256', Buffer.from('x')), argType('key', /sign\.PrivateKey/))
  assert.throws(() => engine.sign(sk, 5, Buffer.from('x')), argType('algorithm'))
  assert.throws(() => engine.sign(sk, 'ecdsa-p256-sha256', 'text'), argType('data', BYTES))
  assert.throws(() => engine.signSync(sk, 'ecdsa-p256-sha256', 7), argType('data', BYTES))
  assert.throws(() => kf.sign.PrivateKey.fromPem(7), argType('pem', /of type string or an instance of Buffer, TypedArray, DataView, ArrayBuffer, or KeyObject/))
  assert.throws(() => engine.loadKey({}), argType('pem', /KeyObject/))
  assert.throws(() => engine.loadEnvelope(), argType('envelope', BYTES))
  assert.throws(() => engine.attachRemote(engine), argType('remote', /sign\.RemoteSigner/))
  // A string's text is never shown: it may be a secret where bytes belong.
  assert.throws(() => kf.abe.encryptSync(publicKey, 'a: b', 'my secret'), (e) => argType('message')(e) && !e.message.includes('secret') && /type string \(length 9\)/.test(e.message))
  // The stack starts at the caller, not inside keyfence.
  assert.throws(() => kf.abe.policyOf(1), (e) => e.stack.split('\n')[1].includes(__filename))
  // A method called on the wrong object, a class called without new, a
  // class JavaScript does not construct.
  assert.throws(() => kf.sign.Engine.prototype.metrics.call({}), { name: 'TypeError', code: 'ERR_INVALID_THIS', message: 'Value of "this" must be of type Engine' })
  assert.throws(() => Object.getOwnPropertyDescriptor(kf.sign.PrivateKey.prototype, 'kind').get.call({}), { name: 'TypeError', code: 'ERR_INVALID_THIS' })
  assert.throws(() => kf.sign.Engine(), { name: 'TypeError', code: 'ERR_CONSTRUCT_CALL_REQUIRED' })
  assert.throws(() => new kf.abe.MasterKey(), { name: 'TypeError', code: 'ERR_ILLEGAL_CONSTRUCTOR', message: /abe\.MasterKey\.fromBytes/ })
  engine.close()
})

test('bytes: any TypedArray, DataView or ArrayBuffer, wherever bytes are taken', async () => {
  const { publicKey, masterKey } = await kf.abe.setup()
  const key = await kf.abe.keygen(masterKey, { a: 'b' })
  const data = crypto.randomBytes(64)
  const ab = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength)
  // Views over part of a larger buffer read only their own bytes.
  const padded = Buffer.concat([Buffer.from('xxxx'), data, Buffer.from('yyyy')])
  const forms = {
    Buffer: data,
    Uint8Array: new Uint8Array(ab),
    Uint16Array: new Uint16Array(ab),
    Float64Array: new Float64Array(ab),
    BigInt64Array: new BigInt64Array(ab),
    DataView: new DataView(padded.buffer, padded.byteOffset + 4, 64),
    ArrayBuffer: ab,
    'Uint8Array (offset)': new Uint8Array(padded.buffer, padded.byteOffset + 4, 64),
  }
  const engine = new kf.sign.Engine()
  const { privateKey, publicKey: verifyKey } = crypto.generateKeyPairSync('ed25519')
  const sk = kf.sign.PrivateKey.fromPem(privateKey)
  for (const [form, bytes] of Object.entries(forms)) {
    const ct = kf.abe.encryptSync(publicKey, 'a: b', bytes)
    assert.deepEqual(kf.abe.decryptSync(key, ct), data, form)
    const ctForms = [ct.buffer.slice(ct.byteOffset, ct.byteOffset + ct.length), new DataView(ct.buffer, ct.byteOffset, ct.length)]
    for (const c of ctForms) {
      assert.deepEqual(await kf.abe.decrypt(key, c), data, form)
      assert.equal(kf.abe.policyOf(c), 'a: b')
      assert.equal(kf.abe.couldDecrypt({ a: 'b' }, c), true)
    }
    assert.equal(crypto.verify(null, data, verifyKey, await engine.sign(sk, 'ed25519', bytes)), true, form)
    assert.equal(crypto.verify(null, data, verifyKey, engine.signSync(sk, 'ed25519', bytes)), true, form)
  }
  const pkBytes = publicKey.toBytes()
  assert.deepEqual(kf.abe.PublicKey.fromBytes(new DataView(pkBytes.buffer, pkBytes.byteOffset, pkBytes.length)).toBytes(), pkBytes)
  const kb = key.toBytes()
  assert.deepEqual(kf.abe.AttributeKey.fromBytes(kb.buffer.slice(kb.byteOffset, kb.byteOffset + kb.length)).labels, ['a'])
  engine.close()
})

test('a private key may be a node:crypto KeyObject', async (t) => {
  const engine = new kf.sign.Engine()
  const isolated = new kf.sign.Engine({ isolated: true })
  t.after(() => {
    engine.close()
    isolated.close()
  })
  const data = Buffer.from('signed with a KeyObject')
  const cases = [
    ['ec', { namedCurve: 'P-256' }, 'ec-p256', 'ecdsa-p256-sha256', (s, k) => crypto.verify('sha256', data, k, s)],
    ['ec', { namedCurve: 'P-384' }, 'ec-p384', 'ecdsa-p384-sha384', (s, k) => crypto.verify('sha384', data, k, s)],
    ['rsa', { modulusLength: 2048 }, 'rsa-2048', 'rsa-pkcs1-sha256', (s, k) => crypto.verify('sha256', data, k, s)],
    ['ed25519', undefined, 'ed25519', 'ed25519', (s, k) => crypto.verify(null, data, k, s)],
  ]
  for (const [type, opts, kind, alg, verify] of cases) {
    const { privateKey, publicKey } = crypto.generateKeyPairSync(type, opts)
    for (const sk of [kf.sign.PrivateKey.fromPem(privateKey), engine.loadKey(privateKey), isolated.loadKey(privateKey)]) {
      assert.equal(sk.kind, kind)
      assert.deepEqual(sk.publicKeyDer(), publicKey.export({ type: 'spki', format: 'der' }))
      assert.equal(verify(await engine.sign(sk, alg, data), publicKey), true, kind)
    }
  }
  const { publicKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' })
  const refused = { name: 'TypeError', code: 'ERR_CRYPTO_INVALID_KEY_OBJECT_TYPE' }
  assert.throws(() => kf.sign.PrivateKey.fromPem(publicKey), { ...refused, message: 'Invalid key object type public, expected private.' })
  assert.throws(() => engine.loadKey(crypto.createSecretKey(Buffer.alloc(32))), refused)
  // A private key of a kind keyfence does not sign with is the core's refusal.
  assert.throws(() => kf.sign.PrivateKey.fromPem(crypto.generateKeyPairSync('x25519').privateKey), { code: 'INVALID_PRIVATE_KEY' })
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
