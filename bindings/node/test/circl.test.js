'use strict'
// CP-ABE interop through Node with Cloudflare CIRCL, both ways, through the
// Go oracle (vectors/circl-oracle) that `./x test` builds and names in
// KEYFENCE_CIRCL_ORACLE.
const test = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const kf = require('..')

const { repo } = require('../test-support/cli')

// ./x test builds the oracle once and names it; run alone, this builds it
// with Go (part of the toolchain), and fails rather than skips without Go.
function buildOracle() {
  if (process.env.KEYFENCE_CIRCL_ORACLE) return process.env.KEYFENCE_CIRCL_ORACLE
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-oracle-')), 'circl-oracle')
  execFileSync('go', ['build', '-o', out, '.'], { cwd: path.join(repo, 'vectors', 'circl-oracle'), stdio: 'inherit' })
  return out
}
const oracle = buildOracle()

function circl(...args) {
  execFileSync(oracle, args, { stdio: ['ignore', 'ignore', 'inherit'] })
}

test('CIRCL keys and ciphertexts decrypt in Node; Node ciphertexts decrypt in CIRCL', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-circl-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const f = (name) => path.join(dir, name)

  circl('setup', '--pk', f('pk'), '--msk', f('msk'))
  circl('keygen', '--msk', f('msk'), '--attrs', 'country=FR,region=EU', '--out', f('key'))
  fs.writeFileSync(f('msg'), 'from CIRCL')
  circl('encrypt', '--pk', f('pk'), '--policy', 'region: EU and not country: DE', '--in', f('msg'), '--out', f('ct'))

  const publicKey = kf.abe.PublicKey.fromBytes(fs.readFileSync(f('pk')))
  const masterKey = kf.abe.MasterKey.fromBytes(fs.readFileSync(f('msk')))
  const circlKey = kf.abe.AttributeKey.fromBytes(fs.readFileSync(f('key')))
  assert.equal((await kf.abe.decrypt(circlKey, fs.readFileSync(f('ct')))).toString(), 'from CIRCL')
  assert.equal(kf.abe.policyOf(fs.readFileSync(f('ct'))), 'region: EU and not country: DE')

  // Node encrypts under CIRCL's public key; CIRCL decrypts with its own key.
  fs.writeFileSync(f('ct2'), await kf.abe.encrypt(publicKey, 'region: EU or country: US', Buffer.from('from Node')))
  circl('decrypt', '--key', f('key'), '--in', f('ct2'), '--out', f('pt2'))
  assert.equal(fs.readFileSync(f('pt2'), 'utf8'), 'from Node')

  // A key Node issues from CIRCL's master key decrypts in CIRCL.
  fs.writeFileSync(f('nodekey'), (await kf.abe.keygen(masterKey, { region: 'EU', country: 'FR' })).toBytes())
  circl('decrypt', '--key', f('nodekey'), '--in', f('ct'), '--out', f('pt3'))
  assert.equal(fs.readFileSync(f('pt3'), 'utf8'), 'from CIRCL')

  // A key that does not satisfy the policy fails in both.
  circl('keygen', '--msk', f('msk'), '--attrs', 'country=DE,region=EU', '--out', f('de'))
  const de = kf.abe.AttributeKey.fromBytes(fs.readFileSync(f('de')))
  await assert.rejects(kf.abe.decrypt(de, fs.readFileSync(f('ct'))), { code: 'POLICY_NOT_SATISFIED' })
})
