'use strict'
// Attributes as Node users hold them: a plain object or a Map, read as
// given. Only an object's own enumerable properties count (never its
// prototype's), a Map's entries are its attributes, anything else is a
// TypeError, and text with a lone surrogate (which has no UTF-8 form, and
// napi would silently turn into U+FFFD) is refused as Python and C refuse
// it.
const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const kf = require('..')

const EU = { region: 'EU', country: 'FR' }
const badText = { name: 'KeyfenceError', code: 'INVALID_ARGUMENT', message: /lone surrogate/ }

test('a Map is read as its entries, everywhere attributes are taken', async (t) => {
  const map = new Map(Object.entries(EU))
  assert.equal(kf.policy.check('region: EU', new Map([['region', 'EU']])), true)
  assert.equal(kf.policy.check('region: EU and not country: DE', map), true)
  assert.equal(kf.policy.check('region: EU', new Map([['region', 'US']])), false)
  assert.equal(kf.policy.check('region: EU', new Map()), false)

  const { publicKey, masterKey } = kf.abe.setupSync()
  const key = kf.abe.keygenSync(masterKey, map)
  assert.deepEqual([...key.labels].sort(), ['country', 'region'])
  assert.deepEqual([...(await kf.abe.keygen(masterKey, map)).labels].sort(), ['country', 'region'])
  const ct = kf.abe.encryptSync(publicKey, 'region: EU and country: FR', Buffer.from('for a Map'))
  assert.equal(kf.abe.decryptSync(key, ct).toString(), 'for a Map')
  assert.equal(kf.abe.couldDecrypt(map, ct), true)
  assert.equal(kf.abe.couldDecrypt(new Map([['region', 'EU']]), ct), false)

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-attrs-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const auth = kf.wrap.Authority.initSync(dir)
  const envelope = auth.wrapSync('country: FR', Buffer.from('wrapped'))
  for (const machineKey of [auth.issueSync(map), await auth.issue(map)]) {
    const machine = new kf.wrap.Machine(machineKey, dir)
    assert.deepEqual([...machine.labels].filter((l) => l !== 'machine').sort(), ['country', 'region'])
    assert.equal(machine.openSync(envelope).toString(), 'wrapped')
  }
  // A Map subclass is read through Map's own entries.
  class Odd extends Map {
    entries() {
      return [['region', 'US']][Symbol.iterator]()
    }
  }
  assert.equal(kf.policy.check('region: EU', new Odd([['region', 'EU']])), true)
  // A Map's values and labels must be strings.
  assert.throws(() => kf.policy.check('a: b', new Map([['a', 1]])), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"attrs\.get\('a'\)" property must be of type string/ })
  assert.throws(() => kf.policy.check('a: b', new Map([[1, 'b']])), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"attrs".*a label is not a string/ })
})

test('only own enumerable properties count', () => {
  // Inherited attributes satisfied `a: b` before.
  assert.equal(kf.policy.check('a: b', Object.create({ a: 'b' })), false)
  const { masterKey } = kf.abe.setupSync()
  assert.deepEqual(kf.abe.keygenSync(masterKey, Object.assign(Object.create({ inherited: 'x' }), { own: 'y' })).labels, ['own'])
  const hidden = {}
  Object.defineProperty(hidden, 'a', { value: 'b', enumerable: false })
  assert.equal(kf.policy.check('a: b', hidden), false)
  // Symbols are not labels.
  assert.equal(kf.policy.check('a: b', { a: 'b', [Symbol('x')]: 1 }), true)
  // What Object.prototype holds is never read, even when polluted.
  Object.prototype.polluted = 'yes'
  try {
    assert.equal(kf.policy.check('polluted: yes', {}), false)
    assert.equal(kf.policy.check('polluted: yes', new Map()), false)
  } finally {
    delete Object.prototype.polluted
  }
  // Objects without a prototype, class instances, and the label __proto__.
  const bare = Object.create(null)
  bare.region = 'EU'
  assert.equal(kf.policy.check('region: EU', bare), true)
  class Attrs {
    constructor() {
      this.region = 'EU'
    }
  }
  assert.equal(kf.policy.check('region: EU', new Attrs()), true)
  assert.equal(kf.policy.check('"__proto__": x', JSON.parse('{"__proto__": "x"}')), true)
})

test('what is not attributes is a TypeError naming the argument', () => {
  const type = { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"attrs" argument must be of type object \(label: value\) or an instance of Map/ }
  for (const attrs of [undefined, null, 'region=EU', 42, [['region', 'EU']], new Set(['region']), new WeakMap(), Buffer.from('x'), () => {}]) {
    assert.throws(() => kf.policy.check('region: EU', attrs), type)
    assert.throws(() => kf.abe.couldDecrypt(attrs, Buffer.alloc(1)), type)
  }
  const { masterKey } = kf.abe.setupSync()
  assert.throws(() => kf.abe.keygenSync(masterKey, [['a', 'b']]), type)
  assert.throws(() => kf.abe.keygen(masterKey, new Set()), type)
  assert.throws(() => kf.policy.check('a: b', { a: 1 }), { name: 'TypeError', code: 'ERR_INVALID_ARG_TYPE', message: /"attrs\.a" property must be of type string/ })
})

test('a lone surrogate in a label or value is refused, never read as U+FFFD', async (t) => {
  // Before, napi turned each into U+FFFD: both of these were true.
  assert.throws(() => kf.policy.check('region: "\ufffd"', { region: '\ud800' }), badText)
  assert.throws(() => kf.policy.check('"\ufffd": EU', { '\udc00': 'EU' }), badText)
  assert.throws(() => kf.policy.check('a: b', new Map([['a', 'b\ud83d']])), badText)
  assert.throws(() => kf.policy.check('a: b', { ['\ud83dx']: 'b' }), (e) => e instanceof kf.KeyfenceError && e.code === 'INVALID_ARGUMENT' && /attribute label of "attrs"/.test(e.message))
  // A well-formed pair is not a lone surrogate.
  assert.equal(kf.policy.check('e: "\ud83d\ude00"', { e: '\ud83d\ude00' }), true)

  const { publicKey, masterKey } = kf.abe.setupSync()
  assert.throws(() => kf.abe.keygenSync(masterKey, { a: '\ud800' }), badText)
  assert.throws(() => kf.abe.keygen(masterKey, { a: '\ud800' }), badText)
  const ct = kf.abe.encryptSync(publicKey, 'a: b', Buffer.from('x'))
  assert.throws(() => kf.abe.couldDecrypt({ a: '\udfff' }, ct), badText)
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-node-attrs-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const auth = kf.wrap.Authority.initSync(dir)
  assert.throws(() => auth.issueSync({ '\ud800': 'x' }), badText)
  assert.throws(() => auth.issue(new Map([['a', '\ud800']])), badText)
  // Other text (a policy, a path) is refused too, as INVALID_ARGUMENT, as
  // the Python binding refuses it.
  assert.throws(() => kf.policy.check('region: "\ud800"', { region: '\ufffd' }), { name: 'KeyfenceError', code: 'INVALID_ARGUMENT', message: /"policy" argument is not valid Unicode text/ })
  assert.throws(() => kf.policy.canonical('a: "\udc00"'), { code: 'INVALID_ARGUMENT' })
  assert.throws(() => auth.wrapSync('a: "\ud800"', Buffer.from('x')), { code: 'INVALID_ARGUMENT' })
  assert.throws(() => kf.wrap.Authority.openSync(`${dir}\ud800`), { code: 'INVALID_ARGUMENT' })
})
