'use strict'
// Keys in a PKCS#11 token from Node (a SoftHSM2 token made by
// vectors/softhsm-fixture.sh): every algorithm signs and `crypto.verify`
// checks it against the public key openssl wrote when it made the key;
// each failure has its code; with a key process the token's module is
// never mapped into this process; no PIN shows in a message or in
// `util.inspect`.
//
// SoftHSM reads SOFTHSM2_CONF once per process, when the module is first
// loaded, and a key process inherits this process's environment: the
// fixture's variables are set before any test. node --test runs this file
// in a process of its own; its tests run in order, the isolated ones
// (which check that the module is never mapped here) first.
const test = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const util = require('node:util')
const kf = require('..')

// [label on the token, algorithm]: every algorithm family a token key signs.
const CASES = [
  ['tls-p256', 'ecdsa-p256-sha256'],
  ['tls-p384', 'ecdsa-p384-sha384'],
  ['tls-rsa', 'rsa-pkcs1-sha256'],
  ['tls-rsa', 'rsa-pss-sha256'],
  ['tls-ed', 'ed25519'],
]

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-pkcs11-'))
process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }))
const fixture = spawnSync('bash', [path.join(__dirname, '..', '..', '..', 'vectors', 'softhsm-fixture.sh'), dir], {
  encoding: 'utf8',
  timeout: 300_000,
})
// Exit 77: SoftHSM2 is not installed (with KEYFENCE_REQUIRE_SERVERS set, the
// fixture fails instead, and so does this file).
const skip = fixture.status === 77 ? fixture.stderr.trim() : false
if (!skip) {
  assert.equal(fixture.status, 0, fixture.stderr)
  for (const line of fs.readFileSync(path.join(dir, 'env'), 'utf8').split('\n').filter(Boolean)) {
    const i = line.indexOf('=')
    process.env[line.slice(0, i)] = line.slice(i + 1)
  }
}
const module_ = process.env.KEYFENCE_PKCS11_MODULE
const pin = skip ? '' : fs.readFileSync(path.join(dir, 'pin'), 'utf8').split('\n')[0]
// Not the right PIN, nor part of it.
const badPin = pin === '97531864' ? '86420975' : '97531864'
if (!skip) fs.writeFileSync(path.join(dir, 'badpin'), `${badPin}\n`)

/** The URI of `label` on `edge`, with the module and the PIN file named in it. */
const uri = (label, pinFile = 'pin', token = 'edge') =>
  `pkcs11:token=${token};object=${label};type=private?module-path=${module_}&pin-source=file:${path.join(dir, pinFile)}`

/** The public key openssl made `label` with (not the token's). */
const publicKey = (label) => crypto.createPublicKey(fs.readFileSync(path.join(dir, 'keys', `${label}.pem`)))

/** node:crypto's verdict on `sig` over `data`. */
function verifies(label, alg, data, sig) {
  const key = publicKey(label)
  switch (alg) {
    case 'ecdsa-p256-sha256':
    case 'rsa-pkcs1-sha256':
      return crypto.verify('sha256', data, key, sig)
    case 'ecdsa-p384-sha384':
      return crypto.verify('sha384', data, key, sig)
    case 'rsa-pss-sha256':
      return crypto.verify('sha256', data, { key, padding: crypto.constants.RSA_PKCS1_PSS_PADDING, saltLength: 32 }, sig)
    case 'ed25519':
      return crypto.verify(null, data, key, sig)
    default:
      throw new Error(alg)
  }
}

const softhsmMapped = () => fs.readFileSync('/proc/self/maps', 'utf8').includes('libsofthsm2')

/** The keys of CASES loaded through `engine`, each public key checked against openssl's. */
function loadAll(engine) {
  const keys = {}
  for (const [label] of CASES) {
    keys[label] ??= engine.loadPkcs11(uri(label))
    const der = publicKey(label).export({ type: 'spki', format: 'der' })
    assert.ok(keys[label].publicKeyDer().equals(der), label)
  }
  return keys
}

/** Every case signed (promise and signSync) and verified by node:crypto. */
async function signEveryAlgorithm(engine) {
  const keys = loadAll(engine)
  assert.equal(keys['tls-p256'].isLocal, false)
  for (const [label, alg] of CASES) {
    const data = Buffer.from(`${label} signs with ${alg}`)
    const sig = await engine.sign(keys[label], alg, data)
    assert.ok(verifies(label, alg, data, sig), `${label} ${alg}`)
    assert.ok(!verifies(label, alg, Buffer.from('another message'), sig), `${label} ${alg}: the check can fail`)
    assert.ok(verifies(label, alg, data, engine.signSync(keys[label], alg, data)), `${label} ${alg} (signSync)`)
  }
  const many = CASES.flatMap((c) => Array(10).fill(c))
  const sigs = await Promise.all(many.map(([label, alg], i) => engine.sign(keys[label], alg, Buffer.from(`${i}`))))
  sigs.forEach((sig, i) => assert.ok(verifies(many[i][0], many[i][1], Buffer.from(`${i}`), sig)))
  return keys
}

/** The error `f` throws. */
function thrown(f) {
  try {
    f()
  } catch (e) {
    return e
  }
  assert.fail('no error')
}

// --- Through the key process: this process never maps the module. ------

test('isolated: every algorithm, and the module is never mapped here', { skip }, async () => {
  assert.ok(!softhsmMapped(), 'a test before this one loaded the module into this process')
  const engine = new kf.sign.Engine({ isolated: true })
  try {
    await signEveryAlgorithm(engine)
    // The module and PIN file from the environment the key process inherited.
    const key = engine.loadPkcs11('pkcs11:token=edge;object=tls-ed')
    const sig = await engine.sign(key, 'ed25519', Buffer.from('m'))
    assert.ok(verifies('tls-ed', 'ed25519', Buffer.from('m'), sig))
    // Here the held keys count on the classes of their kinds; the token's
    // threads are the key process's.
    const m = engine.metrics()
    assert.equal(m.token.completed, 0)
    assert.ok(m.ec.completed > 0 && m.rsa.completed > 0, JSON.stringify(m))
    // Refused by the key process, which never echoes a PIN.
    const e = thrown(() => engine.loadPkcs11(`pkcs11:token=edge;object=tls-p256?module-path=${module_}&pin-value=${badPin}`))
    assert.ok(e instanceof kf.KeyfenceError && e.message.includes('pin-source'), `${e}`)
    assert.ok(!e.message.includes(badPin) && !util.inspect(e).includes(badPin))
  } finally {
    engine.close()
  }
  assert.ok(!softhsmMapped(), "an isolated engine's token key mapped the module into this process")
})

// --- In this process: from here on the module is mapped. ----------------

test('a refused PIN is TOKEN_LOGIN, and not tried again', { skip }, () => {
  // Before any right PIN in this process, so that the token itself refuses it.
  const engine = new kf.sign.Engine()
  try {
    const e = thrown(() => engine.loadPkcs11(uri('tls-p256', 'badpin')))
    assert.ok(e instanceof kf.KeyfenceError, `${e}`)
    assert.equal(e.code, 'TOKEN_LOGIN')
    assert.match(e.message, /PIN/)
    const again = thrown(() => engine.loadPkcs11(uri('tls-p256', 'badpin')))
    assert.equal(again.code, 'TOKEN_LOGIN')
    assert.match(again.message, /does not try it again/)
    for (const text of [e.message, e.stack, util.inspect(e), again.message, util.inspect(again)]) {
      assert.ok(!text.includes(badPin) && !text.includes(pin), text)
    }
  } finally {
    engine.close()
  }
  assert.ok(softhsmMapped())
})

test('in this process: every algorithm, on the token class', { skip }, async () => {
  const engine = new kf.sign.Engine({ token: { threads: 3, queueCapacity: 64 } })
  try {
    const keys = await signEveryAlgorithm(engine)
    const m = engine.metrics()
    assert.equal(m.token.workers, 3)
    assert.equal(m.token.queueCapacity, 64)
    assert.equal(m.token.completed, 5 * 2 + 50)
    assert.equal(m.ec.completed + m.rsa.completed, 0)
    assert.match(engine.metricsPrometheus(), /class="token"/)
    // util.inspect shows the kind, never a PIN or the URI.
    const shown = util.inspect(keys['tls-rsa'])
    assert.match(shown, /rsa-2048/)
    assert.ok(!shown.includes(pin) && !shown.includes('pkcs11:'), shown)
    assert.equal(keys['tls-ed'].kind, 'ed25519')
  } finally {
    engine.close()
  }
})

test('each failure has its code', { skip }, () => {
  const engine = new kf.sign.Engine()
  const code = (f) => {
    const e = thrown(f)
    assert.ok(e instanceof kf.KeyfenceError, `${e}`)
    assert.ok(!e.message.includes(pin), e.message)
    return e
  }
  let e = code(() => engine.loadPkcs11(uri('no-such-key')))
  assert.equal(e.code, 'INVALID_PRIVATE_KEY')
  assert.match(e.message, /no-such-key/)
  // No such token: the message lists the module's tokens.
  e = code(() => engine.loadPkcs11(uri('tls-p256', 'pin', 'no-such-token')))
  assert.equal(e.code, 'INVALID_PRIVATE_KEY')
  assert.match(e.message, /edge/)
  e = code(() => engine.loadPkcs11('pkcs11:token=edge;object=tls-p256?module-path=/nonexistent/libnothing.so'))
  assert.equal(e.code, 'INVALID_CONFIG')
  e = code(() => engine.loadPkcs11(`pkcs11:token=edge;object=tls-p256?pin-value=${pin}`))
  assert.equal(e.code, 'INVALID_ARGUMENT')
  e = code(() => engine.loadPkcs11('not a uri'))
  assert.equal(e.code, 'INVALID_ARGUMENT')
  e = code(() => engine.loadPkcs11(uri('tls-p256', 'no-such-pin-file')))
  assert.equal(e.code, 'INVALID_ARGUMENT')
  assert.match(e.message, /PIN file/)
  // A key of one kind asked for another's algorithm.
  const key = engine.loadPkcs11(uri('tls-p256'))
  assert.throws(() => engine.signSync(key, 'rsa-pss-sha256', Buffer.from('m')), { code: 'INVALID_REQUEST' })
  // Not a string: what Node's own APIs throw, the value not shown.
  assert.throws(() => engine.loadPkcs11(42), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"uri" argument must be of type string/ })
  assert.throws(() => engine.loadPkcs11(Buffer.from(uri('tls-p256'))), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' })
  assert.throws(() => new kf.sign.Engine({ token: { threads: 0 } }), { name: 'RangeError', code: 'ERR_OUT_OF_RANGE' })
  engine.close()
  assert.throws(() => engine.loadPkcs11(uri('tls-p256')), { code: 'SHUT_DOWN' })
})

test("docs/node.md's token block runs against this token", { skip }, () => {
  const doc = fs.readFileSync(path.join(__dirname, '..', '..', '..', 'docs', 'node.md'), 'utf8')
  const section = doc.split('\n## Keys in a PKCS#11 token\n')[1]
  const block = section && section.match(/```js\n([\s\S]*?)```/)
  assert.ok(block, "docs/node.md's token section has a js block")
  // The page's shell block makes what the fixture makes: softhsm2.conf,
  // pin, the token `edge` with the key `tls-p256`. The block runs in the
  // fixture's folder, with keyfence installed there as a project would.
  fs.mkdirSync(path.join(dir, 'node_modules'), { recursive: true })
  fs.symlinkSync(path.resolve(__dirname, '..'), path.join(dir, 'node_modules', 'keyfence'), 'dir')
  fs.writeFileSync(path.join(dir, 'token_block.js'), block[1])
  const env = { ...process.env }
  delete env.SOFTHSM2_CONF // the block sets it
  const out = spawnSync(process.execPath, ['token_block.js'], { cwd: dir, env, encoding: 'utf8', timeout: 60_000 })
  assert.equal(out.status, 0, out.stderr)
  const expected = [...block[1].matchAll(/console\.log\(.*\) \/\/ (.*)$/gm)].map((m) => m[1])
  assert.deepEqual(out.stdout.trim().split('\n'), expected)
})
