'use strict'
// The multi-buffer device through Node (`new Engine({ offload })`), in this
// process and in the key process, on the stand-in crypto_mb
// (vectors/crypto-mb-stand-in/: Intel's names and ABI, each lane signed
// with OpenSSL, on any CPU). The stand-in's log shows the lanes it signed
// together; node:crypto verifies every signature.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const kf = require('..')

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-mb-'))
const standIn = path.join(work, 'libcrypto_mb_stand_in.so')
execFileSync('cc', ['-shared', '-fPIC', '-O1', '-o', standIn,
  path.join(__dirname, '../../../vectors/crypto-mb-stand-in/crypto_mb_stand_in.c'), '-lcrypto'])
const log = path.join(work, 'calls.log')
// The stand-in reads these at each call; the key process inherits them
// and, under its sandbox, may write only a token's folder.
process.env.KF_MB_LOG = log
process.env.KEYFENCE_PKCS11_TOKEN_DIRS = work
test.after(() => fs.rmSync(work, { recursive: true, force: true }))

const { privateKey, publicKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 })
const pem = privateKey.export({ type: 'pkcs8', format: 'pem' })

// The calls of more than one lane the stand-in logged; the log is emptied.
function grouped() {
  const lines = fs.existsSync(log) ? fs.readFileSync(log, 'utf8').split('\n').filter(Boolean) : []
  fs.writeFileSync(log, '')
  return lines.map((l) => l.split(' ')).filter(([kind, bits, lanes]) => kind === 'rsa' && bits === '2048' && Number(lanes) > 1)
}

async function signMany(engine) {
  const key = engine.loadKey(pem)
  const data = Array.from({ length: 48 }, (_, i) => Buffer.from(`message ${i}`))
  const sigs = await Promise.all(data.map((d) => engine.sign(key, 'rsa-pkcs1-sha256', d)))
  sigs.forEach((s, i) => assert.equal(crypto.verify('sha256', data[i], publicKey, s), true))
}

for (const isolated of [false, true]) {
  test(`${isolated ? 'a key process' : 'this process'} signs in groups on the device`, async (t) => {
    grouped()
    const engine = new kf.sign.Engine({ isolated, offload: 'on', cryptoMb: standIn })
    t.after(() => engine.close())
    await signMany(engine)
    assert.ok(grouped().length > 0, 'the stand-in signed lanes together')
  })
}

test('off never calls the library; bad settings say what is wrong', async (t) => {
  grouped()
  const engine = new kf.sign.Engine({ offload: 'off', cryptoMb: standIn })
  t.after(() => engine.close())
  await signMany(engine)
  assert.equal(grouped().length, 0)

  assert.throws(() => new kf.sign.Engine({ offload: 'maybe' }), { code: 'INVALID_CONFIG', message: /off, on or auto/ })
  assert.throws(() => new kf.sign.Engine({ offload: 1 }), { code: 'ERR_INVALID_ARG_TYPE' })
  assert.throws(() => new kf.sign.Engine({ cryptoMb: standIn }), { code: 'INVALID_CONFIG', message: /set the offload mode too/ })
  assert.throws(() => new kf.sign.Engine({ agent: path.join(work, 'agent.sock'), offload: 'on' }),
    { code: 'INVALID_CONFIG', message: /choose their own/ })
  // `on` where crypto_mb says nothing runs on this CPU: refused, saying
  // why; `auto` signs in software.
  process.env.KF_MB_MODE = 'unsupported'
  t.after(() => delete process.env.KF_MB_MODE)
  assert.throws(() => new kf.sign.Engine({ offload: 'on', cryptoMb: standIn }), { code: 'BACKEND_FAILED', message: /crypto_mb/ })
  const soft = new kf.sign.Engine({ offload: 'auto', cryptoMb: standIn })
  t.after(() => soft.close())
  await signMany(soft)
  assert.equal(grouped().length, 0)
})
