'use strict'
// The store named by one string, from Node: an etcd cluster (three members
// on loopback, vectors/etcd-fixture.sh) and a directory, each with a
// machine that follows the store and sees a rotation arrive through the
// watch.
const test = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const kf = require('..')

const tmp = () => fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-etcd-'))
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// Starts the cluster; its endpoints, or null (with the reason) when etcd is
// not installed. The members are killed by process group when `t` ends.
function cluster (t) {
  const dir = tmp()
  const fixture = path.join(__dirname, '..', '..', '..', 'vectors', 'etcd-fixture.sh')
  const r = spawnSync('bash', [fixture, dir], { encoding: 'utf8', timeout: 400_000 })
  t.after(() => {
    const pids = path.join(dir, 'pids')
    if (fs.existsSync(pids)) {
      for (const g of fs.readFileSync(pids, 'utf8').split('\n').filter(Boolean)) {
        try { process.kill(-Number(g), 'SIGKILL') } catch {}
      }
    }
    fs.rmSync(dir, { recursive: true, force: true })
  })
  if (r.status === 77) return { skip: r.stderr.trim() }
  assert.equal(r.status, 0, r.stderr)
  return { endpoints: fs.readFileSync(path.join(dir, 'endpoints'), 'utf8').trim() }
}

async function wrapOpenFollow (store) {
  const auth = await kf.wrap.Authority.init(store)
  const env = await auth.wrap('region: EU', Buffer.from('customer secret'))
  const m = new kf.wrap.Machine(await auth.issue({ region: 'EU' }), store)
  assert.equal((await m.open(env)).toString(), 'customer secret')
  await m.follow()
  m.followSync() // a second call changes nothing
  const before = m.cacheStats()
  assert.equal(before.propagations, 0)
  assert.equal(before.misses, 1)
  assert.equal(before.entries, 1)
  assert.equal((await auth.rotateMaster()).resealed, 1)
  const deadline = Date.now() + 30_000
  let after = m.cacheStats()
  while (after.propagations < 1) {
    assert.ok(Date.now() < deadline, `no rotation reached the machine in 30 s: ${JSON.stringify(after)}`)
    await sleep(10)
    after = m.cacheStats()
  }
  assert.ok(after.watchEvents >= 1 && after.resyncs === 0, JSON.stringify(after))
  assert.ok(after.propagationLastUs <= after.propagationMaxUs && after.propagationMaxUs < 30e6, JSON.stringify(after))
  assert.equal((await m.open(env)).toString(), 'customer secret')
  assert.ok(await (await kf.wrap.Authority.open(store)).issue({ region: 'EU' }))
}

test('wrap, open and follow a rotation on etcd', async (t) => {
  const c = cluster(t)
  if (c.skip) return t.skip(c.skip)
  await wrapOpenFollow(`etcd://${c.endpoints}/node`)
})

test('wrap, open and follow a rotation on a directory', async (t) => {
  const dir = tmp()
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  await wrapOpenFollow(path.join(dir, 'store'))
})

test('a bad etcd name is refused before any request', async () => {
  await assert.rejects(kf.wrap.Authority.open('etcd://no-port/kf'), (e) => e.code === 'INVALID_ARGUMENT' && /HOST:PORT/.test(e.message))
})
