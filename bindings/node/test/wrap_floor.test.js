'use strict'
// A machine's floor kept across processes (issue 55.9): a machine made
// with `{ state }` keeps the newest generation list it accepted in that
// file, and a NEW process (a child Node process) whose machine names the
// same file refuses a store rolled back to an older list with
// REPLAYED_OBJECT; one without the file takes the old list (the control).
// newestLists() and require() hand the floor from one machine to another.
const test = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const kf = require('..')

const SECRET = '-----BEGIN PRIVATE KEY-----\n...'

// One open in a process that has accepted nothing: prints OK, or the
// error's code.
const CHILD = `
const kf = require(${JSON.stringify(path.resolve(__dirname, '..'))})
const fs = require('node:fs')
const [store, key, envelope, state] = process.argv.slice(1)
const m = new kf.wrap.Machine(fs.readFileSync(key), store, state === '-' ? undefined : { state })
m.open(fs.readFileSync(envelope)).then(
  (secret) => console.log(secret.toString() === ${JSON.stringify(SECRET)} ? 'OK' : 'WRONG SECRET'),
  (e) => console.log(e instanceof kf.KeyfenceError ? e.code : String(e)),
)
`

/**
 * A store whose generation list moved forward (a master rotation), a
 * machine key, an envelope, and the list from before the rotation.
 */
async function rolledBack(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-floor-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const store = path.join(dir, 'store')
  const auth = await kf.wrap.Authority.init(store)
  const machineKey = await auth.issue({ region: 'EU', country: 'DE' })
  const envelope = await auth.wrap('region: EU', Buffer.from(SECRET))
  const generations = path.join(store, 'public', 'generations')
  const oldList = fs.readFileSync(generations)
  // Generation 1 goes decrypt-only, 2 is active: the old list (1 active)
  // goes back on the new one, yet 1 is live in both.
  assert.equal((await auth.rotateMaster()).resealed, 1)
  const keyFile = path.join(dir, 'fra.key')
  const envFile = path.join(dir, 'secret.env')
  fs.writeFileSync(keyFile, machineKey)
  fs.writeFileSync(envFile, envelope)
  return {
    dir,
    store,
    machineKey,
    envelope,
    // What a store writer can do: put back the older list, which the
    // authority did sign.
    rollBack: () => fs.writeFileSync(generations, oldList),
    openInNewProcess: (state) =>
      execFileSync(process.execPath, ['-e', CHILD, store, keyFile, envFile, state], { encoding: 'utf8', timeout: 60000 }).trim(),
  }
}

test('a new process with the state file refuses a rolled-back generation list', async (t) => {
  const w = await rolledBack(t)
  const state = path.join(w.dir, 'fra.key.newest')
  const m = new kf.wrap.Machine(w.machineKey, w.store, { state })
  assert.equal((await m.open(w.envelope)).toString(), SECRET)
  assert.equal(fs.readFileSync(state).subarray(0, 4).toString(), 'KFN2')
  assert.equal(fs.statSync(`${state}.lock`).mode & 0o777, 0o600)

  w.rollBack()
  assert.equal(w.openInNewProcess(state), 'REPLAYED_OBJECT')
  // The control: a new process without the file takes the old list.
  assert.equal(w.openInNewProcess('-'), 'OK')
  // A fresh file is no floor either; the refusal above changed nothing.
  assert.equal(w.openInNewProcess(path.join(w.dir, 'fresh.newest')), 'OK')
  assert.equal(w.openInNewProcess(state), 'REPLAYED_OBJECT')
})

test('newestLists and require hand the floor to another machine', async (t) => {
  const w = await rolledBack(t)
  const seen = new kf.wrap.Machine(w.machineKey, w.store)
  assert.deepEqual(seen.newestLists(), Buffer.concat([Buffer.from('KFN2'), Buffer.alloc(8)]), 'nothing accepted yet')
  assert.equal(seen.openSync(w.envelope).toString(), SECRET)
  const lists = seen.newestLists()
  assert.ok(Buffer.isBuffer(lists) && lists.length > 12)

  w.rollBack()
  const required = new kf.wrap.Machine(w.machineKey, w.store, {})
  required.require(new Uint8Array(lists))
  required.require(lists.buffer.slice(lists.byteOffset, lists.byteOffset + lists.length)) // the same floor again
  await assert.rejects(required.open(w.envelope), (e) => e instanceof kf.KeyfenceError && e.code === 'REPLAYED_OBJECT' && /generation list/.test(e.message))
  assert.throws(() => required.openSync(w.envelope), { code: 'REPLAYED_OBJECT' })
  assert.deepEqual(required.newestLists(), lists)
  // Not required, the old list is taken.
  assert.equal((await new kf.wrap.Machine(w.machineKey, w.store).open(w.envelope)).toString(), SECRET)

  // A machine with a state file writes a floor it is required to.
  const state = path.join(w.dir, 'required.newest')
  new kf.wrap.Machine(w.machineKey, w.store, { state }).require(lists)
  assert.deepEqual(fs.readFileSync(state), lists)
  assert.equal(w.openInNewProcess(state), 'REPLAYED_OBJECT')
})

test('bad floors are KeyfenceErrors with a code, bad arguments TypeErrors', async (t) => {
  const w = await rolledBack(t)
  const m = new kf.wrap.Machine(w.machineKey, w.store)
  for (const bad of [Buffer.alloc(0), Buffer.from('KFE2'), Buffer.concat([Buffer.from('KFN2'), Buffer.alloc(7)])]) {
    assert.throws(() => m.require(bad), (e) => e instanceof kf.KeyfenceError && e.code === 'INVALID_ENVELOPE' && /newest lists/.test(e.message))
  }
  assert.throws(() => m.require('KFN2'), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' })
  assert.throws(() => m.newestLists.call({}), { code: 'ERR_INVALID_THIS' })

  // Lists another authority signed: refused, nothing required.
  const otherStore = path.join(w.dir, 'other')
  const other = await kf.wrap.Authority.init(otherStore)
  const stranger = new kf.wrap.Machine(await other.issue({ region: 'EU' }), otherStore)
  await stranger.open(await other.wrap('region: EU', Buffer.from('x')))
  assert.throws(() => m.require(stranger.newestLists()), { code: 'WRONG_AUTHORITY' })
  w.rollBack()
  assert.equal((await m.open(w.envelope)).toString(), SECRET)

  // A floor that cannot be kept is an error when the machine is made.
  const missing = path.join(w.dir, 'no-such-folder', 'fra.key.newest')
  assert.throws(() => new kf.wrap.Machine(w.machineKey, w.store, { state: missing }), (e) => e.code === 'STORE_IO' && e.message.includes('no-such-folder'))
  const garbage = path.join(w.dir, 'garbage.newest')
  fs.writeFileSync(garbage, 'not lists')
  assert.throws(() => new kf.wrap.Machine(w.machineKey, w.store, { state: garbage }), (e) => e.code === 'INVALID_ENVELOPE' && e.message.includes('garbage.newest'))
  assert.throws(() => new kf.wrap.Machine(w.machineKey, w.store, { state: 5 }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' })
  assert.throws(() => new kf.wrap.Machine(w.machineKey, w.store, { statePath: garbage }), { name: 'TypeError', message: /unknown property "statePath"/ })
  assert.throws(() => new kf.wrap.Machine(w.machineKey, w.store, garbage), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE' })
})
