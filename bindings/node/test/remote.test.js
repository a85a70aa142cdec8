'use strict'
// Remote signing against a real `keyfence serve` on loopback, set up by
// vectors/remote-fixture.sh (the fixture the C and Python tests run too): a
// Tokyo machine that may not open a US-only key signs with it through the
// US server, node:crypto verifies, and failures reject with stable codes in
// bounded time.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const util = require('node:util')
const { execFileSync } = require('node:child_process')
const kf = require('..')
const { cli, repo } = require('../test-support/cli')

const msg = Buffer.from('a TLS handshake from Tokyo')
const US = { country: 'US', region: 'NA' }

function server(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-remote-'))
  execFileSync('bash', [path.join(repo, 'vectors', 'remote-fixture.sh'), cli(), dir], { timeout: 120000 })
  const pid = Number(fs.readFileSync(path.join(dir, 'server.pid'), 'utf8'))
  t.after(() => {
    try {
      process.kill(pid, 'SIGKILL')
    } catch {}
    fs.rmSync(dir, { recursive: true, force: true })
  })
  const f = (name) => path.join(dir, name)
  return { dir, pid, f, addr: fs.readFileSync(f('server.addr'), 'utf8').trim(), env: fs.readFileSync(f('key.env')) }
}

function remote(s, attributes = US, client = 'client', extra = {}) {
  return new kf.sign.RemoteSigner({
    peers: [{ name: 'sfo1', address: s.addr, attributes }],
    cert: s.f(`${client}.pem`),
    key: s.f(`${client}.key`),
    ca: s.f('ca.pem'),
    ...extra,
  })
}

const verify = (s, sig) => crypto.verify('sha256', msg, fs.readFileSync(s.f('key.pub.pem')), sig)

test('a key this machine may not open is signed by the server that may', async (t) => {
  const s = server(t)
  const engine = new kf.sign.Engine({ timeoutMs: 3000 })
  t.after(() => engine.close())
  const r = remote(s, US, 'client', { tenant: 7, requestTimeoutMs: 1000, maxAttempts: 2 })
  const tokyo = new kf.wrap.Machine(fs.readFileSync(s.f('nrt1.machine')), s.f('store'))
  const sfo = new kf.wrap.Machine(fs.readFileSync(s.f('sfo1.machine')), s.f('store'))

  const key = await r.openOrForward(tokyo, s.env)
  assert.equal(key.isLocal, false)
  assert.equal(verify(s, await engine.sign(key, 'ecdsa-p256-sha256', msg)), true)
  assert.deepEqual(key.publicKeyDer(), crypto.createPublicKey(fs.readFileSync(s.f('key.pub.pem'))).export({ type: 'spki', format: 'der' }))
  const local = await r.openOrForward(sfo, s.env)
  assert.equal(local.isLocal, true)
  assert.equal(verify(s, engine.signSync(local, 'ecdsa-p256-sha256', msg)), true)

  assert.match(r.metrics(), /peer="sfo1"/)
  assert.doesNotMatch(engine.metricsPrometheus(), /keyfence_remote_client/)
  engine.attachRemote(r)
  assert.match(engine.metricsPrometheus(), /keyfence_engine_[\s\S]*keyfence_remote_client_operations_total/)
  assert.equal(util.inspect(r), 'RemoteSigner {}')

  r.close()
  await assert.rejects(r.key(s.env), { code: 'SHUT_DOWN' })
  assert.throws(() => r.metrics(), { code: 'SHUT_DOWN' })
  // Its keys keep their own reference.
  assert.equal(verify(s, await engine.sign(key, 'ecdsa-p256-sha256', msg)), true)
})

test('refusals have stable codes', async (t) => {
  const engine = new kf.sign.Engine()
  t.after(() => engine.close())
  const s = server(t)
  const eu = remote(s, { country: 'DE' })
  await assert.rejects(eu.key(s.env), (e) => e instanceof kf.KeyfenceError && e.code === 'BACKEND_FAILED' && /no configured peer/.test(e.message))
  await assert.rejects(eu.key(s.env.subarray(0, s.env.length - 1)), { code: 'INVALID_ENVELOPE' })
  // A client certificate from another CA gets nothing.
  await assert.rejects(remote(s, US, 'stranger').key(s.env), { code: 'BACKEND_FAILED' })
  const tls = { cert: s.f('client.pem'), key: s.f('client.key'), ca: s.f('ca.pem') }
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [], ...tls }), { code: 'INVALID_CONFIG' })
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ name: 'x', address: 'not an address', attributes: US }], ...tls }), { code: 'INVALID_CONFIG' })
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ name: 'x', address: s.addr, attributes: { a: '' } }], ...tls }), { code: 'INVALID_ATTRIBUTES' })
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ name: 'x', address: s.addr, attributes: US }], ...tls, maxAttempts: 0 }), { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' })
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ name: 'x', address: s.addr, attributes: US }], ...tls, cert: s.f('missing.pem') }), { code: 'INVALID_CONFIG' })
  assert.throws(() => new kf.sign.RemoteSigner({ peers: 'sfo1', ...tls }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"options\.peers" property must be an instance of Array/ })
  // A peer's attributes may be a Map, as everywhere attributes are taken.
  const signer = new kf.sign.RemoteSigner({ peers: [{ name: 'sfo1', address: s.addr, attributes: new Map(Object.entries(US)) }], ...tls })
  assert.equal(verify(s, await engine.sign(await signer.key(s.env), 'ecdsa-p256-sha256', msg)), true)
})

test('a killed server fails in bounded time', async (t) => {
  const s = server(t)
  const engine = new kf.sign.Engine({ timeoutMs: 3000 })
  t.after(() => engine.close())
  const key = await remote(s).key(s.env)
  assert.equal(verify(s, await engine.sign(key, 'ecdsa-p256-sha256', msg)), true)
  process.kill(s.pid, 'SIGKILL')
  const t0 = Date.now()
  await assert.rejects(engine.sign(key, 'ecdsa-p256-sha256', msg), (e) => ['BACKEND_FAILED', 'TIMED_OUT'].includes(e.code))
  assert.ok(Date.now() - t0 < 5000, `${Date.now() - t0} ms`)
})

test('options are checked before anything starts: RangeError, TypeError naming the option', () => {
  const tls = { cert: 'client.pem', key: 'client.key', ca: 'ca.pem' }
  const peers = [{ name: 'sfo1', address: '127.0.0.1:1', attributes: US }]
  const range = (name) => ({ name: 'RangeError', code: 'ERR_OUT_OF_RANGE', message: new RegExp(`"options\\.${name}" is out of range`) })
  const type = (name) => ({ name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: new RegExp(`"options\\.${name.replace(/[[\]]/g, '\\$&')}"`) })
  for (const [field, values] of [['connectTimeoutMs', [0, -1, 1.5, 2 ** 32 + 5]], ['requestTimeoutMs', [0, 2 ** 32]], ['maxAttempts', [0, 2.5]], ['tenant', [-1, 2 ** 32, 0.5]]]) {
    for (const v of values) assert.throws(() => new kf.sign.RemoteSigner({ peers, ...tls, [field]: v }), range(field))
    assert.throws(() => new kf.sign.RemoteSigner({ peers, ...tls, [field]: '5' }), type(field))
  }
  assert.throws(() => new kf.sign.RemoteSigner({ peers, ...tls, cert: undefined }), type('cert'))
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ address: '127.0.0.1:1', attributes: US }], ...tls }), type('peers[0].name'))
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ ...peers[0], attributes: [['country', 'US']] }], ...tls }), type('peers[0].attributes'))
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ ...peers[0], port: 1 }], ...tls }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /unknown property "port"/ })
  assert.throws(() => new kf.sign.RemoteSigner({ peers, ...tls, retries: 2 }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /unknown property "retries"/ })
  assert.throws(() => new kf.sign.RemoteSigner(), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"options" argument must be of type object/ })
  // A peer's attributes are read as everywhere: a Map's entries, an
  // object's own properties; the core refuses an empty value either way.
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ ...peers[0], attributes: new Map([['a', '']]) }], ...tls }), { code: 'INVALID_ATTRIBUTES' })
  assert.throws(() => new kf.sign.RemoteSigner({ peers: [{ ...peers[0], attributes: { a: '\ud800' } }], ...tls }), { name: 'KeyfenceError', code: 'INVALID_ARGUMENT' })
})
