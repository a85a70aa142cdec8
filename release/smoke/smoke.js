// The installed npm packages, used as a user would: CP-ABE on CIRCL's
// bytes, wrap and open, and a signature from the key process that Node's
// crypto verifies. Run from a project that installed the packed tarballs,
// with the toolchains hidden from PATH.
//
//   node smoke.js VECTORS_DIR WORK_DIR   (prints the version)
'use strict'
const crypto = require('node:crypto')
const fs = require('node:fs')
const path = require('node:path')

const [vectors, work] = process.argv.slice(2)
const project = process.cwd()
const kf = require(require.resolve('keyfence', { paths: [project] }))

function fail(msg) {
  console.error(`smoke.js: ${msg}`)
  process.exit(1)
}

// The addon comes from the installed platform package, not a build tree.
const addons = fs.readFileSync('/proc/self/maps', 'utf8').split('\n')
  .map((l) => l.split(/\s+/).pop()).filter((p) => p && p.endsWith('.node'))
const expected = path.join(fs.realpathSync(project), 'node_modules', 'keyfence-linux-x64-gnu')
if (addons.length === 0) fail('no addon is mapped')
for (const a of addons) if (!fs.realpathSync(a).startsWith(expected + path.sep)) fail(`addon loaded from ${a}, not ${expected}`)

async function main() {
  const read = (d, f) => fs.readFileSync(path.join(vectors, d, `${f}.bin`))
  kf.abe.PublicKey.fromBytes(read('ok', 'public_key'))
  const key = kf.abe.AttributeKey.fromBytes(read('ok', 'attribute_key'))
  const plain = await kf.abe.decrypt(key, read('ok', 'ciphertext'))
  if (!plain.equals(read('ok', 'plaintext'))) fail('CIRCL ciphertext decrypted to other bytes')
  const other = kf.abe.AttributeKey.fromBytes(read('refused', 'attribute_key'))
  const refused = await kf.abe.decrypt(other, read('refused', 'ciphertext')).then(() => null, (e) => e)
  if (!(refused instanceof kf.KeyfenceError) || refused.code !== 'POLICY_NOT_SATISFIED') fail(`refusal: ${refused}`)

  const store = path.join(work, 'store')
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' })
  const pem = Buffer.from(privateKey.export({ type: 'pkcs8', format: 'pem' }))
  const auth = await kf.wrap.Authority.init(store)
  const envelope = await auth.wrap('region: EU and not country: DE', pem)
  const machineKey = path.join(work, 'fra1.machine')
  fs.writeFileSync(machineKey, await auth.issue({ region: 'EU', country: 'FR' }), { mode: 0o600 })
  const machine = new kf.wrap.Machine(fs.readFileSync(machineKey), store)
  if (!(await machine.open(envelope)).equals(pem)) fail('the envelope opened to other bytes')

  // The key process ships in the platform package, beside the addon.
  const engine = new kf.sign.Engine({ isolated: true })
  if (!engine.keyProcessPid) fail('the isolated engine has no key process')
  const sk = engine.loadEnvelope(store, machineKey, envelope)
  const data = Buffer.from('release smoke test')
  const sig = await engine.sign(sk, 'ecdsa-p256-sha256', data)
  if (!crypto.verify('sha256', data, publicKey, sig)) fail('Node crypto refuses the signature')
  engine.close()
  console.log(kf.version())
}

main().catch((e) => fail(e.stack || e))
