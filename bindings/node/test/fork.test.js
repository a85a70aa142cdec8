'use strict'
// What fork means for Node (docs/node.md, "Child processes, cluster and
// workers"): Node never forks a running process. child_process.fork() and
// cluster.fork() start a new Node process that loads keyfence anew, so each
// makes its own engine (its own threads, its own key process) and loads
// its own keys; a keyfence object sent to it arrives as a plain object,
// which no call takes. A worker thread likewise loads the addon anew.
const test = require('node:test')
const assert = require('node:assert/strict')
const { fork } = require('node:child_process')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const kf = require('..')

const pkg = path.resolve(__dirname, '..')

// The child: its own isolated engine, a key from a file, a signature for
// the parent, and what became of the keyfence object the parent sent.
const child = `
const fs = require('node:fs')
const kf = require(${JSON.stringify(pkg)})
process.once('message', async ({ keyFile, sent }) => {
  const engine = new kf.sign.Engine({ isolated: true })
  const key = engine.loadKey(fs.readFileSync(keyFile))
  let refused = null
  try {
    engine.signSync(sent, 'ecdsa-p256-sha256', Buffer.from('x'))
  } catch (e) {
    refused = e.code
  }
  const sig = await engine.sign(key, 'ecdsa-p256-sha256', Buffer.from('from the child'))
  process.send({ keyProcessPid: engine.keyProcessPid, sent, refused, sig: sig.toString('base64') })
  engine.close()
  process.disconnect()
})
`

test('a forked child makes its own engine, key process and keys', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-fork-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' })
  const keyFile = path.join(dir, 'key.pem')
  fs.writeFileSync(keyFile, privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 })
  fs.writeFileSync(path.join(dir, 'child.js'), child)

  const engine = new kf.sign.Engine({ isolated: true })
  t.after(() => engine.close())
  const key = engine.loadKey(privateKey)
  const proc = fork(path.join(dir, 'child.js'), { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const answer = new Promise((resolve, reject) => {
    proc.once('message', resolve)
    proc.once('error', reject)
    proc.once('exit', (code) => reject(new Error(`the child exited ${code} without answering`)))
  })
  proc.send({ keyFile, sent: key })
  const got = await answer
  // Its own key process, not the parent's.
  assert.ok(got.keyProcessPid > 0)
  assert.notEqual(got.keyProcessPid, engine.keyProcessPid)
  assert.equal(crypto.verify('sha256', Buffer.from('from the child'), publicKey, Buffer.from(got.sig, 'base64')), true)
  // The parent's key arrived as a plain object: no call takes it.
  assert.deepEqual(got.sent, {})
  assert.equal(got.refused, 'ERR_INVALID_ARG_TYPE')
  // The parent's engine and key are untouched.
  const sig = await engine.sign(key, 'ecdsa-p256-sha256', Buffer.from('parent'))
  assert.equal(crypto.verify('sha256', Buffer.from('parent'), publicKey, sig), true)
})

test('a worker thread loads keyfence anew and makes its own engine', async () => {
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ed25519')
  const worker = new Worker(
    `const { parentPort, workerData } = require('node:worker_threads')
     const kf = require(${JSON.stringify(pkg)})
     const engine = new kf.sign.Engine()
     engine.sign(kf.sign.PrivateKey.fromPem(workerData), 'ed25519', Buffer.from('from a worker')).then((s) => {
       parentPort.postMessage(s)
       engine.close()
     })`,
    { eval: true, workerData: privateKey.export({ type: 'pkcs8', format: 'pem' }) },
  )
  const sig = await new Promise((resolve, reject) => {
    worker.once('message', resolve)
    worker.once('error', reject)
  })
  await new Promise((resolve) => worker.once('exit', resolve))
  assert.equal(crypto.verify(null, Buffer.from('from a worker'), publicKey, Buffer.from(sig)), true)
})
