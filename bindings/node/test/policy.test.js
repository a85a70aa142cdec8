'use strict'
const test = require('node:test')
const assert = require('node:assert/strict')
const kf = require('..')

test('version is the core version', () => {
  assert.match(kf.version(), /^\d+\.\d+\.\d+/)
})

test('policy.check evaluates without keys', () => {
  assert.equal(kf.policy.check('region: EU and not country: DE', { region: 'EU', country: 'FR' }), true)
  assert.equal(kf.policy.check('region: EU and not country: DE', { region: 'EU', country: 'DE' }), false)
  assert.equal(kf.policy.check('team: "key ops"', { team: 'key ops' }), true)
  assert.equal(kf.policy.check('region: EU', {}), false)
})

test('a syntax error has its code and byte position', () => {
  assert.throws(() => kf.policy.check('a: b or', { a: 'b' }), (e) => {
    assert.ok(e instanceof kf.KeyfenceError)
    assert.ok(e instanceof Error)
    assert.equal(e.name, 'KeyfenceError')
    assert.equal(e.code, 'POLICY_SYNTAX')
    assert.equal(e.position, 7)
    assert.match(e.message, /\^/)
    return true
  })
  assert.throws(() => kf.policy.check('country: US)', {}), { code: 'POLICY_SYNTAX', position: 11 })
})

test('policy too large and bad attributes', () => {
  const deep = '('.repeat(80) + 'a: b' + ')'.repeat(80)
  assert.throws(() => kf.policy.check(deep, {}), { code: 'POLICY_TOO_LARGE' })
  assert.throws(() => kf.policy.check('a: b', { a: '' }), { code: 'INVALID_ATTRIBUTES' })
  assert.throws(() => kf.policy.check('a: b', { '': 'b' }), { code: 'INVALID_ATTRIBUTES' })
})

test('text not in Unicode NFC is refused, never compared as other bytes', async () => {
  const nfd = 'Zu\u0308rich'
  assert.equal(nfd.normalize('NFC'), 'Z\u00fcrich')
  assert.throws(() => kf.policy.check(`city: "${nfd}"`, { city: 'Z\u00fcrich' }), { code: 'POLICY_SYNTAX', position: 6 })
  assert.throws(() => kf.policy.check('city: "Z\u00fcrich"', { city: nfd }), {
    code: 'INVALID_ATTRIBUTES',
    message: /not in Unicode NFC.*write "Z\u00fcrich"/
  })
  const { masterKey } = await kf.abe.setup()
  await assert.rejects(kf.abe.keygen(masterKey, { city: nfd }), { code: 'INVALID_ATTRIBUTES' })
  assert.equal(kf.policy.check('city: "Z\u00fcrich"', { city: nfd.normalize('NFC') }), true)
})

test('policy.canonical', () => {
  assert.equal(kf.policy.canonical('region:EU and (not country:DE)'), 'region: EU and not country: DE')
  assert.throws(() => kf.policy.canonical('and'), { code: 'POLICY_SYNTAX', position: 0 })
})
