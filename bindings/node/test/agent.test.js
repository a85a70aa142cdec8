'use strict'
// Signing through a real key agent (`keyfence agent`, docs/deploy.md),
// started with the command line: this process names only the agent's socket
// and loads envelopes, with no store and no machine key; node:crypto
// verifies. A key the agent's machine may not open is refused with the
// agent's reason; the agent killed and started again, the engine connects
// again and signs, within a bounded wait.
const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const util = require('node:util')
const { execFileSync, spawn } = require('node:child_process')
const kf = require('..')
const { cli, repo } = require('../test-support/cli')

const msg = Buffer.from('signed by the agent')

/**
 * A store and a machine key (country=US) only the agent reads, and what a
 * client has: `key.env` (P-256) and `rsa.env` under `country: US`, their
 * public keys (`key.pub`, `rsa.pub`), and `fr.env` under `country: FR`,
 * which the agent's machine may not open. Made with the command line, as an
 * operator would (and as docs/node.md's shell block does).
 */
function world(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-agent-'))
  const f = (name) => path.join(dir, name)
  const kfcli = cli()
  const run = (...args) => execFileSync(kfcli, args, { cwd: dir, stdio: 'pipe', timeout: 120000 })
  run('authority', 'init', '--store', 'store')
  run('authority', 'issue', '--store', 'store', '--attrs', 'country=US', '--out', 'machine.key')
  const pub = {}
  for (const [name, type, options] of [['key', 'ec', { namedCurve: 'P-256' }], ['rsa', 'rsa', { modulusLength: 2048 }]]) {
    const { privateKey, publicKey } = crypto.generateKeyPairSync(type, options)
    fs.writeFileSync(f(`${name}.pem`), privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 })
    run('authority', 'wrap', '--store', 'store', '--policy', 'country: US', '--in', `${name}.pem`, '--out', `${name}.env`)
    fs.writeFileSync(f(`${name}.pub`), publicKey.export({ type: 'spki', format: 'pem' }))
    pub[name] = publicKey
  }
  run('authority', 'wrap', '--store', 'store', '--policy', 'country: FR', '--in', 'key.pem', '--out', 'fr.env')
  // The agent reads the servers' copy, without the authority's secrets.
  run('authority', 'export', '--store', 'store', '--to', 'served')
  // From here on only the envelopes hold the keys.
  fs.rmSync(f('key.pem'))
  fs.rmSync(f('rsa.pem'))

  const socket = f('agent.sock')
  let agent = null
  let starts = 0
  const w = {
    dir,
    f,
    socket,
    pub,
    env: (name) => fs.readFileSync(f(`${name}.env`)),
    /** Starts the agent; resolves on its `listening` line (at most 30 s). */
    start() {
      assert.equal(agent, null, 'the agent runs already')
      starts += 1
      const log = fs.openSync(f(`agent-${starts}.log`), 'w')
      const child = spawn(kfcli, ['agent', '--socket', socket, '--store', 'served', '--machine-key', 'machine.key'], {
        cwd: dir,
        stdio: ['ignore', 'pipe', log],
      })
      fs.closeSync(log)
      agent = child
      return new Promise((resolve, reject) => {
        let out = ''
        const timer = setTimeout(() => {
          w.kill()
          reject(new Error(`the agent did not start in 30 s: ${fs.readFileSync(f(`agent-${starts}.log`), 'utf8')}`))
        }, 30000)
        child.stdout.on('data', (chunk) => {
          out += chunk
          if (/^listening/m.test(out)) {
            clearTimeout(timer)
            resolve()
          }
        })
        child.on('exit', (code, sig) => {
          clearTimeout(timer)
          reject(new Error(`the agent exited (${code ?? sig}): ${fs.readFileSync(f(`agent-${starts}.log`), 'utf8')}`))
        })
      })
    },
    /** Kills the agent by its pid (SIGKILL: its socket file stays, as after a crash); resolves once it is gone. */
    kill() {
      const child = agent
      agent = null
      if (child === null || child.exitCode !== null || child.signalCode !== null) return Promise.resolve()
      const gone = new Promise((resolve) => child.once('exit', resolve))
      try {
        process.kill(child.pid, 'SIGKILL')
      } catch {}
      return gone
    },
  }
  t.after(async () => {
    await w.kill()
    fs.rmSync(dir, { recursive: true, force: true })
  })
  return w
}

const verifyEc = (w, sig, data = msg) => crypto.verify('sha256', data, w.pub.key, sig)

/** `attempt()` until it resolves, for at most `ms`; its last rejection then. */
async function within(ms, attempt) {
  const until = Date.now() + ms
  for (;;) {
    try {
      return await attempt()
    } catch (e) {
      if (!['BACKEND_FAILED', 'TIMED_OUT'].includes(e.code) || Date.now() > until) throw e
    }
    await new Promise((r) => setTimeout(r, 50))
  }
}

test('an agent\'s engine loads envelopes without a store or machine key, and signs', async (t) => {
  const w = world(t)
  await w.start()
  const engine = new kf.sign.Engine({ agent: w.socket, timeoutMs: 5000 })
  t.after(() => engine.close())
  assert.equal(engine.agent, w.socket)
  assert.equal(engine.isolated, true)
  assert.equal(util.inspect(engine), `Engine { isolated: true, agent: '${w.socket}' }`)
  const sk = engine.loadEnvelope(w.env('key'))
  assert.equal(sk.isLocal, false)
  assert.equal(sk.kind, 'ec-p256')
  assert.equal(verifyEc(w, await engine.sign(sk, 'ecdsa-p256-sha256', msg)), true)
  assert.equal(verifyEc(w, engine.signSync(sk, 'ecdsa-p256-sha256', msg)), true)
  const data = Array.from({ length: 50 }, (_, i) => Buffer.from(`handshake ${i}`))
  const sigs = await Promise.all(data.map((d) => engine.sign(sk, 'ecdsa-p256-sha256', d)))
  sigs.forEach((s, i) => assert.equal(verifyEc(w, s, data[i]), true))
  assert.deepEqual(sk.publicKeyDer(), w.pub.key.export({ type: 'spki', format: 'der' }))
  // An RSA key through the same agent; any Uint8Array for the envelope.
  const rsa = engine.loadEnvelope(new Uint8Array(w.env('rsa')))
  const rsig = await engine.sign(rsa, 'rsa-pss-sha256', msg)
  assert.equal(crypto.verify('sha256', msg, { key: w.pub.rsa, padding: crypto.constants.RSA_PKCS1_PSS_PADDING, saltLength: 32 }, rsig), true)
  // A store and machine key given anyway are not read: the agent opens with its own.
  const again = engine.loadEnvelope(w.f('no-such-store'), w.f('no-such.key'), w.env('key'))
  assert.equal(verifyEc(w, await engine.sign(again, 'ecdsa-p256-sha256', msg)), true)
  engine.close()
  assert.throws(() => engine.loadEnvelope(w.env('key')), { code: 'SHUT_DOWN' })
})

test('the agent refuses what its machine may not open, with its reason', async (t) => {
  const w = world(t)
  await w.start()
  const engine = new kf.sign.Engine({ agent: w.socket })
  t.after(() => engine.close())
  const start = Date.now()
  assert.throws(
    () => engine.loadEnvelope(w.env('fr')),
    // A "no", as the same load is in process, not a broken backend.
    (e) => e instanceof kf.KeyfenceError && e.code === 'POLICY_NOT_SATISFIED' && /do not satisfy/.test(e.message),
  )
  assert.ok(Date.now() - start < 10000)
  // Bytes that are no envelope are refused here, before the agent.
  assert.throws(() => engine.loadEnvelope(Buffer.from('junk')), { code: 'INVALID_ENVELOPE' })
  // Wrong types and counts: TypeErrors naming the argument.
  const argType = (name) => (e) => e instanceof TypeError && e.code === 'ERR_INVALID_ARG_TYPE' && e.message.includes(`"${name}"`)
  assert.throws(() => engine.loadEnvelope('key.env'), argType('machineKey'))
  assert.throws(() => engine.loadEnvelope(w.env('key'), 'machine.key'), argType('store'))
  assert.throws(() => engine.loadEnvelope(null, null, w.env('key')), argType('store'))
  assert.throws(() => engine.loadEnvelope(42), argType('envelope'))
  // An agent's engine loads envelopes only: no key bytes.
  assert.throws(() => engine.loadKey(fs.readFileSync(w.f('key.env'))), (e) => e.code === 'INVALID_ARGUMENT' && /envelopes only/.test(e.message))
  // The engine still signs after the refusals.
  const sk = engine.loadEnvelope(w.env('key'))
  assert.equal(verifyEc(w, await engine.sign(sk, 'ecdsa-p256-sha256', msg)), true)
})

test('the engine connects again when the agent comes back', async (t) => {
  const w = world(t)
  await w.start()
  const engine = new kf.sign.Engine({ agent: w.socket, timeoutMs: 2000 })
  t.after(() => engine.close())
  const sk = engine.loadEnvelope(w.env('key'))
  assert.equal(verifyEc(w, await engine.sign(sk, 'ecdsa-p256-sha256', msg)), true)
  await w.kill()
  // No agent: a typed failure, in bounded time.
  const start = Date.now()
  await assert.rejects(engine.sign(sk, 'ecdsa-p256-sha256', msg), (e) => ['BACKEND_FAILED', 'TIMED_OUT'].includes(e.code) && /agent/.test(e.message))
  assert.ok(Date.now() - start < 10000)
  // Started again on the same socket (its stale file replaced): the engine
  // connects again and loads its keys again; the handle this process holds
  // signs again.
  await w.start()
  assert.equal(verifyEc(w, await within(20000, () => engine.sign(sk, 'ecdsa-p256-sha256', msg))), true)
  assert.equal(verifyEc(w, engine.signSync(sk, 'ecdsa-p256-sha256', msg)), true)
})

test('agent options are checked', async (t) => {
  const w = world(t)
  await w.start()
  const invalid = (e) => e instanceof kf.KeyfenceError && e.code === 'INVALID_ARGUMENT' && e.message.length > 20
  const argType = { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"options\.agent" property must be of type string/ }
  assert.throws(() => new kf.sign.Engine({ agent: 5 }), argType)
  assert.throws(() => new kf.sign.Engine({ agent: { path: w.socket } }), argType)
  assert.throws(() => new kf.sign.Engine({ agent: w.socket, isolated: true }), (e) => invalid(e) && /exclusive/.test(e.message))
  assert.throws(() => new kf.sign.Engine({ agent: w.socket, keyProcess: '/bin/true' }), (e) => invalid(e) && /exclusive/.test(e.message))
  assert.throws(() => new kf.sign.Engine({ agent: '' }), (e) => invalid(e) && /empty/.test(e.message))
  // `isolated: false` and an agent are fine.
  new kf.sign.Engine({ agent: w.socket, isolated: false }).close()
  // No agent listening: the engine is not made, and says why, at once.
  const start = Date.now()
  assert.throws(() => new kf.sign.Engine({ agent: w.f('nobody.sock') }), (e) => e.code === 'BACKEND_FAILED' && /agent/.test(e.message))
  assert.ok(Date.now() - start < 10000)
  // The envelope alone needs an agent's engine.
  const local = new kf.sign.Engine()
  t.after(() => local.close())
  assert.equal(local.agent, null)
  assert.equal(util.inspect(local), 'Engine { isolated: false }')
  assert.throws(() => local.loadEnvelope(w.env('key')), (e) => invalid(e) && /key agent/.test(e.message))
  // With both, as before: opened here.
  const sk = local.loadEnvelope(w.f('store'), w.f('machine.key'), w.env('key'))
  assert.equal(sk.isLocal, true)
  assert.equal(verifyEc(w, await local.sign(sk, 'ecdsa-p256-sha256', msg)), true)
})

test('the key agent example of docs/node.md runs against an agent', async (t) => {
  const doc = fs.readFileSync(path.join(repo, 'docs', 'node.md'), 'utf8')
  const section = doc.split('\n## Through a key agent\n')[1]
  assert.ok(section, 'docs/node.md has the section')
  const example = section.match(/```js\n([\s\S]*?)```/)[1]
  const w = world(t)
  await w.start()
  // Run from the folder the page's shell block leaves, with the package
  // installed as another project would have it.
  fs.mkdirSync(w.f('node_modules'))
  fs.symlinkSync(path.resolve(__dirname, '..'), w.f('node_modules/keyfence'), 'dir')
  fs.writeFileSync(w.f('example.js'), example)
  const out = execFileSync(process.execPath, ['example.js'], { cwd: w.dir, encoding: 'utf8', timeout: 60000 })
  const expected = [...example.matchAll(/console\.log\(.*\) \/\/ (.*)$/gm)].map((m) => m[1])
  assert.deepEqual(out.trim().split('\n'), expected)
})
