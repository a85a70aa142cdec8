'use strict'
// Signatures are checked with node:crypto, an implementation no one here
// wrote, on keys node:crypto made.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const util = require('node:util')
const kf = require('..')

function pair(type, options) {
  const { privateKey, publicKey } = crypto.generateKeyPairSync(type, options)
  return { pem: privateKey.export({ type: 'pkcs8', format: 'pem' }), publicKey }
}

const keys = {
  p256: pair('ec', { namedCurve: 'P-256' }),
  p384: pair('ec', { namedCurve: 'P-384' }),
  rsa: pair('rsa', { modulusLength: 2048 }),
  ed: pair('ed25519'),
}

const cases = [
  ['ecdsa-p256-sha256', 'p256', (d, k, s) => crypto.verify('sha256', d, k, s)],
  ['ecdsa-p384-sha384', 'p384', (d, k, s) => crypto.verify('sha384', d, k, s)],
  ['rsa-pkcs1-sha256', 'rsa', (d, k, s) => crypto.verify('sha256', d, k, s)],
  ['rsa-pss-sha256', 'rsa', (d, k, s) => crypto.verify('sha256', d, { key: k, padding: crypto.constants.RSA_PKCS1_PSS_PADDING, saltLength: 32 }, s)],
  ['rsa-pss-sha512', 'rsa', (d, k, s) => crypto.verify('sha512', d, { key: k, padding: crypto.constants.RSA_PKCS1_PSS_PADDING, saltLength: 64 }, s)],
  ['ed25519', 'ed', (d, k, s) => crypto.verify(null, d, k, s)],
]

test('every algorithm verifies with node:crypto', async (t) => {
  const engine = new kf.sign.Engine({ isolated: false })
  t.after(() => engine.close())
  for (const [alg, which, verify] of cases) {
    const sk = kf.sign.PrivateKey.fromPem(keys[which].pem)
    const data = crypto.randomBytes(100)
    const sig = await engine.sign(sk, alg, data)
    assert.ok(Buffer.isBuffer(sig))
    assert.equal(verify(data, keys[which].publicKey, sig), true, alg)
    assert.equal(verify(Buffer.concat([data, Buffer.from('!')]), keys[which].publicKey, sig), false, alg)
    assert.equal(verify(data, keys[which].publicKey, engine.signSync(sk, alg, data)), true, `${alg} sync`)
  }
})

test('keys from PEM text or bytes, DER, and their public half', () => {
  const fromText = kf.sign.PrivateKey.fromPem(keys.p256.pem)
  const fromBytes = kf.sign.PrivateKey.fromPem(Buffer.from(keys.p256.pem))
  const der = crypto.createPrivateKey(keys.p256.pem).export({ type: 'pkcs8', format: 'der' })
  const fromDer = kf.sign.PrivateKey.fromPem(der)
  const spki = keys.p256.publicKey.export({ type: 'spki', format: 'der' })
  for (const k of [fromText, fromBytes, fromDer]) {
    assert.equal(k.kind, 'ec-p256')
    assert.equal(k.isLocal, true)
    assert.deepEqual(k.publicKeyDer(), spki)
  }
  assert.equal(kf.sign.PrivateKey.fromPem(keys.rsa.pem).kind, 'rsa-2048')
  assert.equal(kf.sign.PrivateKey.fromPem(keys.ed.pem).kind, 'ed25519')
  assert.doesNotMatch(util.inspect(fromText, { showHidden: true }), /BEGIN|[0-9a-f]{32}/)
  assert.match(util.inspect(fromText), /ec-p256/)
})

test('errors: bad keys, unknown algorithms, mismatches, closed engine', async () => {
  assert.throws(() => kf.sign.PrivateKey.fromPem('-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n'), { code: 'INVALID_PRIVATE_KEY' })
  assert.throws(() => kf.sign.PrivateKey.fromPem(Buffer.alloc(0)), (e) => e instanceof kf.KeyfenceError && e.code === 'INVALID_PRIVATE_KEY')
  const engine = new kf.sign.Engine()
  const sk = kf.sign.PrivateKey.fromPem(keys.p256.pem)
  await assert.rejects(engine.sign(sk, 'rsa-sha1', Buffer.from('x')), { code: 'INVALID_REQUEST' })
  await assert.rejects(engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x')), { code: 'INVALID_REQUEST' })
  assert.throws(() => engine.signSync(sk, 'ed25519', Buffer.from('x')), { code: 'INVALID_REQUEST' })
  assert.throws(() => new kf.sign.Engine({ ec: { threads: 0 } }), { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' })
  assert.throws(() => new kf.sign.Engine({ keyProcess: 'no-such-program' }), { code: 'INVALID_CONFIG' })
  engine.close()
  await assert.rejects(engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('x')), { code: 'SHUT_DOWN' })
  assert.throws(() => engine.metrics(), { code: 'SHUT_DOWN' })
})

test('a full queue rejects with OVERLOADED, at once', async (t) => {
  const engine = new kf.sign.Engine({ rsa: { threads: 1, queueCapacity: 2 } })
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.rsa.pem)
  const results = await Promise.allSettled(Array.from({ length: 50 }, () => engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x'))))
  const overloaded = results.filter((r) => r.status === 'rejected' && r.reason.code === 'OVERLOADED')
  const ok = results.filter((r) => r.status === 'fulfilled')
  assert.ok(overloaded.length > 0, 'some submissions were shed')
  assert.ok(ok.length >= 1, 'the queued ones completed')
  assert.equal(overloaded.length + ok.length, 50)
  assert.ok(overloaded[0].reason instanceof kf.KeyfenceError)
  assert.ok(engine.metrics().rsa.errors.overloaded >= overloaded.length)
})

test('a passed deadline rejects with TIMED_OUT', async (t) => {
  const engine = new kf.sign.Engine({ rsa: { threads: 1, queueCapacity: 1000 }, timeoutMs: 20 })
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.rsa.pem)
  // About a millisecond each on one thread: the tail of 300 waits far past 20 ms.
  const results = await Promise.allSettled(Array.from({ length: 300 }, () => engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x'))))
  const timedOut = results.filter((r) => r.status === 'rejected' && r.reason.code === 'TIMED_OUT')
  assert.ok(timedOut.length > 0)
  assert.ok(results.every((r) => r.status === 'fulfilled' || r.reason.code === 'TIMED_OUT'))
  // A per-signature deadline overrides the engine's.
  const slow = Array.from({ length: 300 }, () => engine.sign(sk, 'rsa-pss-sha256', Buffer.from('y'), { timeoutMs: 60000 }))
  assert.ok((await Promise.allSettled(slow)).every((r) => r.status === 'fulfilled'))
})

test('an AbortSignal cancels queued signatures, which never run', async (t) => {
  const engine = new kf.sign.Engine({ rsa: { threads: 1, queueCapacity: 1000 }, timeoutMs: 60000 })
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.rsa.pem)
  const controller = new AbortController()
  const reason = new Error('client went away')
  // About a millisecond each on one thread: most of 300 are still queued
  // when the signal aborts.
  const pending = Array.from({ length: 300 }, () => engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x'), { signal: controller.signal }))
  controller.abort(reason)
  const results = await Promise.allSettled(pending)
  const cancelled = results.filter((r) => r.status === 'rejected')
  assert.ok(cancelled.length > 200, `${cancelled.length} of 300 cancelled`)
  for (const r of cancelled) {
    assert.ok(r.reason instanceof kf.KeyfenceError)
    assert.equal(r.reason.name, 'AbortError')
    assert.equal(r.reason.code, 'ABORT_ERR')
    assert.equal(r.reason.cause, reason)
  }
  // The cancelled ones did not run: the engine completed only the others.
  const m = engine.metrics().rsa
  assert.equal(m.completed, results.length - cancelled.length)
  assert.equal(m.errors.cancelled, cancelled.length)
  // The signatures that completed are real.
  const done = results.find((r) => r.status === 'fulfilled')
  if (done) assert.equal(crypto.verify('sha256', Buffer.from('x'), { key: keys.rsa.publicKey, padding: crypto.constants.RSA_PKCS1_PSS_PADDING, saltLength: 32 }, done.value), true)
})

test('an aborted signal rejects at once; a shared signal keeps no listeners', async (t) => {
  const events = require('node:events')
  const engine = new kf.sign.Engine()
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.p256.pem)
  const gone = AbortSignal.abort('shutting down')
  await assert.rejects(engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('x'), { signal: gone }), (e) => e instanceof kf.KeyfenceError && e.name === 'AbortError' && e.code === 'ABORT_ERR' && e.cause === 'shutting down')
  // One long-lived signal for a whole server: every settled signature
  // removes its listener.
  const shutdown = new AbortController()
  const sigs = await Promise.all(Array.from({ length: 1000 }, () => engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('y'), { signal: shutdown.signal })))
  assert.ok(sigs.every((s) => crypto.verify('sha256', Buffer.from('y'), keys.p256.publicKey, s)))
  assert.equal(events.getEventListeners(shutdown.signal, 'abort').length, 0)
  for (const timeoutMs of [-1, 0, 1.5, 2 ** 32, 2 ** 32 + 5, NaN, Infinity]) {
    assert.throws(() => engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('y'), { signal: shutdown.signal, timeoutMs }), { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' })
    assert.throws(() => engine.signSync(sk, 'ecdsa-p256-sha256', Buffer.from('y'), { timeoutMs }), { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' })
  }
  assert.equal(events.getEventListeners(shutdown.signal, 'abort').length, 0)
  assert.throws(() => engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('y'), { signal: {} }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"options\.signal" property must be an instance of AbortSignal/ })
  assert.throws(() => engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('y'), { timeout: 5 }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /unknown property "timeout"/ })
  assert.throws(() => engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('y'), 'fast'), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' })
  assert.throws(() => engine.signSync(sk, 'ecdsa-p256-sha256', Buffer.from('y'), { signal: shutdown.signal }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /signSync.*cannot be aborted/ })
  assert.equal(typeof engine.signCancellable, 'undefined')
})

test('1,000 signatures in flight on one signal: one listener, no leak warning, abort cancels them all', async (t) => {
  const events = require('node:events')
  const warnings = []
  const onWarning = (w) => warnings.push(w)
  process.on('warning', onWarning)
  t.after(() => process.off('warning', onWarning))
  const settleWarnings = () => new Promise((r) => setImmediate(r))

  const engine = new kf.sign.Engine({ ec: { threads: 2, queueCapacity: 2000 }, rsa: { threads: 1, queueCapacity: 2000 }, timeoutMs: 60000 })
  t.after(() => engine.close())
  const ec = kf.sign.PrivateKey.fromPem(keys.p256.pem)
  const shutdown = new AbortController()
  const inFlight = Array.from({ length: 1000 }, () => engine.sign(ec, 'ecdsa-p256-sha256', Buffer.from('z'), { signal: shutdown.signal }))
  assert.equal(events.getEventListeners(shutdown.signal, 'abort').length, 1, 'one listener for every signature on the signal')
  const sigs = await Promise.all(inFlight)
  assert.ok(sigs.every((s) => crypto.verify('sha256', Buffer.from('z'), keys.p256.publicKey, s)))
  await settleWarnings()
  assert.deepEqual(warnings.map((w) => `${w.name}: ${w.message}`), [])
  assert.equal(events.getEventListeners(shutdown.signal, 'abort').length, 0, 'the last settled signature removed the listener')

  // The one listener still cancels every signature waiting on the signal:
  // RSA on one thread, about a millisecond each, so most of 1,000 are
  // queued when it aborts; each of them rejects CANCELLED and never runs.
  const rsa = kf.sign.PrivateKey.fromPem(keys.rsa.pem)
  const conn = new AbortController()
  const reason = new Error('client went away')
  const queued = Array.from({ length: 1000 }, () => engine.sign(rsa, 'rsa-pss-sha256', Buffer.from('z'), { signal: conn.signal }))
  assert.equal(events.getEventListeners(conn.signal, 'abort').length, 1)
  conn.abort(reason)
  assert.equal(events.getEventListeners(conn.signal, 'abort').length, 0)
  const results = await Promise.allSettled(queued)
  const rejected = results.filter((r) => r.status === 'rejected')
  for (const r of rejected) {
    assert.ok(r.reason instanceof kf.KeyfenceError)
    assert.equal(r.reason.name, 'AbortError')
    assert.equal(r.reason.code, 'ABORT_ERR')
    assert.equal(r.reason.cause, reason)
  }
  assert.ok(rejected.length >= 500, `${rejected.length} of 1000 cancelled`)
  const m = engine.metrics().rsa
  assert.equal(m.errors.cancelled, rejected.length)
  assert.equal(m.completed, results.length - rejected.length)
  await settleWarnings()
  assert.deepEqual(warnings.map((w) => `${w.name}: ${w.message}`), [])
})

test('AbortSignal.timeout: a TimeoutError with the code of the engine\'s deadline', async (t) => {
  const engine = new kf.sign.Engine({ rsa: { threads: 1, queueCapacity: 1000 }, timeoutMs: 60000 })
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.rsa.pem)
  // About a millisecond each on one thread: most of 300 are still queued
  // when the 20 ms signal fires.
  const signal = AbortSignal.timeout(20)
  const results = await Promise.allSettled(Array.from({ length: 300 }, () => engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x'), { signal })))
  const rejected = results.filter((r) => r.status === 'rejected')
  assert.ok(rejected.length > 0)
  for (const r of rejected) {
    assert.ok(r.reason instanceof kf.KeyfenceError)
    assert.equal(r.reason.name, 'TimeoutError')
    assert.equal(r.reason.code, 'TIMED_OUT')
    assert.ok(r.reason.cause instanceof DOMException)
    assert.equal(r.reason.cause.name, 'TimeoutError')
    assert.equal(r.reason.cause, signal.reason)
  }
  // Fired already: at once.
  await assert.rejects(engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x'), { signal }), { name: 'TimeoutError', code: 'TIMED_OUT' })
  // Any other reason is an abort, whatever its type.
  for (const reason of [undefined, 'bye', 42, new Error('gone'), new DOMException('stop', 'AbortError')]) {
    const c = new AbortController()
    c.abort(reason)
    await assert.rejects(engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x'), { signal: c.signal }), (e) => e instanceof kf.KeyfenceError && e.name === 'AbortError' && e.code === 'ABORT_ERR' && e.cause === c.signal.reason)
  }
})

test('engine options are checked: a RangeError out of range, a TypeError for a wrong type or an unknown option', (t) => {
  const range = { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' }
  const type = { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' }
  // Each of these wrapped or truncated before: -1 as no deadline, 2^32 + 5
  // as 5 ms, 1.5 as 1 ms.
  for (const timeoutMs of [-1, 0, 1.5, 2 ** 32, 2 ** 32 + 5, NaN, Infinity, -Infinity]) {
    assert.throws(() => new kf.sign.Engine({ timeoutMs }), { ...range, message: /"options\.timeoutMs" is out of range\. It must be an integer >= 1 and <= 4294967295/ })
  }
  for (const cls of ['rsa', 'ec', 'slow', 'token']) {
    for (const threads of [0, -1, 1.5, 4097, 2 ** 32 + 1]) assert.throws(() => new kf.sign.Engine({ [cls]: { threads } }), { ...range, message: new RegExp(`"options\\.${cls}\\.threads"`) })
    for (const queueCapacity of [0, 0.5, 2 ** 24 + 1, 2 ** 32]) assert.throws(() => new kf.sign.Engine({ [cls]: { queueCapacity } }), range)
    assert.throws(() => new kf.sign.Engine({ [cls]: { threads: '2' } }), type)
    assert.throws(() => new kf.sign.Engine({ [cls]: 4 }), type)
    assert.throws(() => new kf.sign.Engine({ [cls]: null }), type)
    assert.throws(() => new kf.sign.Engine({ [cls]: { thread: 2 } }), { ...type, message: /"options\.\w+" property has an unknown property "thread": it takes threads, queueCapacity/ })
  }
  assert.throws(() => new kf.sign.Engine({ timeoutMs: '100' }), type)
  assert.throws(() => new kf.sign.Engine({ timeoutMs: 100n }), type)
  assert.throws(() => new kf.sign.Engine({ isolated: 'yes' }), type)
  assert.throws(() => new kf.sign.Engine({ isolated: 1 }), type)
  assert.throws(() => new kf.sign.Engine({ keyProcess: 5 }), type)
  assert.throws(() => new kf.sign.Engine({ agent: 5 }), type)
  assert.throws(() => new kf.sign.Engine({ timeout: 1000 }), { ...type, message: /unknown property "timeout": it takes rsa, ec, slow, token, timeoutMs, isolated, keyProcess, agent/ })
  for (const options of [5, 'fast', true, [], () => {}]) assert.throws(() => new kf.sign.Engine(options), { ...type, message: /"options" argument must be of type object/ })
  // What is in range works, at both ends; undefined is the default.
  for (const options of [undefined, null, {}, { timeoutMs: 1 }, { timeoutMs: 2 ** 32 - 1 }, { ec: { threads: 1, queueCapacity: 1 } }, { timeoutMs: undefined, rsa: undefined }]) {
    const engine = new kf.sign.Engine(options)
    t.after(() => engine.close())
  }
})

test('metrics: every key is camelCase, errors by kind included', async (t) => {
  const engine = new kf.sign.Engine({ timeoutMs: 1 })
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.p256.pem)
  await assert.rejects(engine.sign(sk, 'rsa-pss-sha256', Buffer.from('x')), { code: 'INVALID_REQUEST' })
  const m = engine.metrics()
  const keysOf = (o, at = 'metrics') => Object.entries(o).flatMap(([k, v]) => [`${at}.${k}`, ...(v !== null && typeof v === 'object' ? keysOf(v, `${at}.${k}`) : [])])
  const all = keysOf(m)
  assert.ok(all.length > 50)
  assert.deepEqual(all.filter((k) => !/^[a-z][a-zA-Z0-9]*$/.test(k.slice(k.lastIndexOf('.') + 1))), [])
  for (const cls of ['rsa', 'ec', 'slow', 'token']) {
    assert.deepEqual(Object.keys(m[cls].errors), ['overloaded', 'timedOut', 'cancelled', 'shutDown', 'invalid', 'failed'])
  }
})

test('metrics count per class', async (t) => {
  const engine = new kf.sign.Engine({ ec: { threads: 2, queueCapacity: 64 } })
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.p256.pem)
  await Promise.all(Array.from({ length: 20 }, () => engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('m'))))
  const m = engine.metrics()
  assert.equal(m.ec.workers, 2)
  assert.equal(m.ec.queueCapacity, 64)
  assert.equal(m.ec.completed, 20)
  assert.equal(m.ec.latency.count, 20)
  assert.ok(m.ec.latency.p50 > 0)
  assert.equal(m.rsa.completed, 0)
})

test('the key process, found beside the addon', async (t) => {
  const engine = new kf.sign.Engine({ isolated: true })
  t.after(() => engine.close())
  assert.equal(engine.isolated, true)
  assert.ok(engine.keyProcessPid > 0 && engine.keyProcessPid !== process.pid)
  const sk = engine.loadKey(keys.p256.pem)
  assert.equal(sk.isLocal, false)
  const data = Buffer.from('held elsewhere')
  const sig = await engine.sign(sk, 'ecdsa-p256-sha256', data)
  assert.equal(crypto.verify('sha256', data, keys.p256.publicKey, sig), true)
  const rsa = engine.loadKey(Buffer.from(keys.rsa.pem))
  const rsig = await engine.sign(rsa, 'rsa-pkcs1-sha256', data)
  assert.equal(crypto.verify('sha256', data, keys.rsa.publicKey, rsig), true)
  assert.deepEqual(sk.publicKeyDer(), keys.p256.publicKey.export({ type: 'spki', format: 'der' }))
  assert.throws(() => engine.loadKey('junk'), { code: 'INVALID_PRIVATE_KEY' })
  const m = engine.metrics()
  assert.ok(m.rsa.completed + m.ec.completed + m.slow.completed >= 2)
})

test('an envelope opened by the key process: this process reads only the machine key\'s public part', async (t) => {
  const fs = require('node:fs')
  const os = require('node:os')
  const path = require('node:path')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-envelope-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const store = path.join(dir, 'store')
  const authority = await kf.wrap.Authority.init(store)
  const envelope = await authority.wrap('region: EU', Buffer.from(keys.p256.pem))
  const machineKey = path.join(dir, 'fra1.machine')
  fs.writeFileSync(machineKey, await authority.issue({ region: 'EU', country: 'DE' }), { mode: 0o600 })
  const usKey = path.join(dir, 'sfo1.machine')
  fs.writeFileSync(usKey, await authority.issue({ region: 'NA', country: 'US' }), { mode: 0o600 })
  const data = Buffer.from('opened elsewhere')
  for (const isolated of [true, false]) {
    const engine = new kf.sign.Engine({ isolated })
    t.after(() => engine.close())
    const sk = engine.loadEnvelope(store, machineKey, envelope)
    assert.equal(sk.isLocal, !isolated)
    const sig = await engine.sign(sk, 'ecdsa-p256-sha256', data)
    assert.equal(crypto.verify('sha256', data, keys.p256.publicKey, sig), true)
    // The same typed refusals in both modes, checked before any decryption.
    assert.throws(() => engine.loadEnvelope(store, usKey, envelope), { code: 'POLICY_NOT_SATISFIED' })
    assert.throws(() => engine.loadEnvelope(store, path.join(dir, 'missing'), envelope), { code: 'IO' })
    assert.throws(() => engine.loadEnvelope(store, machineKey, Buffer.from('junk')), { code: 'INVALID_ENVELOPE' })
  }
})

test('1000 signatures in flight, and an idle engine does not hold the process', async (t) => {
  const engine = new kf.sign.Engine()
  t.after(() => engine.close())
  const sk = kf.sign.PrivateKey.fromPem(keys.p256.pem)
  const data = Array.from({ length: 1000 }, (_, i) => Buffer.from(`message ${i}`))
  const sigs = await Promise.all(data.map((d) => engine.sign(sk, 'ecdsa-p256-sha256', d)))
  sigs.forEach((s, i) => assert.equal(crypto.verify('sha256', data[i], keys.p256.publicKey, s), true))
})
