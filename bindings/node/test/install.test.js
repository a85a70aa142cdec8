'use strict'
// The install the docs describe works the same on every machine:
// package-lock.json pins every package npm could install, on any platform
// (so `npm ci` accepts it and `npm install` has nothing to add), and every
// locked package supports every Node.js version package.json's `engines`
// admits, so no supported Node prints EBADENGINE. That range is stated once
// (`engines`); docs/node.md shows it and ./x checks it through
// scripts/check-node.js, whose reading of it must agree with semver's.
const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const semver = require('semver')
const { supported } = require('../scripts/check-node.js')

const here = path.resolve(__dirname, '..')
const pkg = JSON.parse(fs.readFileSync(path.join(here, 'package.json'), 'utf8'))
const lock = JSON.parse(fs.readFileSync(path.join(here, 'package-lock.json'), 'utf8'))
const range = pkg.engines.node

// Where npm's resolution finds `name` from the package at `from`: its own
// node_modules, then each enclosing one up to the root.
function resolve(from, name) {
  let dir = from
  for (;;) {
    const key = (dir ? `${dir}/` : '') + `node_modules/${name}`
    if (lock.packages[key]) return key
    if (!dir) return null
    const cut = dir.lastIndexOf('/node_modules/')
    dir = cut < 0 ? '' : dir.slice(0, cut)
  }
}

test('the lockfile pins every dependency, optional and other platforms\' included', () => {
  assert.equal(lock.lockfileVersion, 3)
  assert.deepEqual(lock.packages[''].devDependencies, pkg.devDependencies, 'package.json and the lockfile disagree: run npm install --package-lock-only')
  const missing = []
  for (const [key, entry] of Object.entries(lock.packages)) {
    for (const field of ['dependencies', 'optionalDependencies', 'devDependencies']) {
      if (key !== '' && field === 'devDependencies') continue
      for (const name of Object.keys(entry[field] || {})) {
        if (!resolve(key, name)) missing.push(`${key || '(root)'} -> ${name}`)
      }
    }
  }
  assert.deepEqual(missing, [], 'lockfile entries missing: npm ci would refuse it, npm install would rewrite it')
})

test('every locked package supports every Node.js version engines admits', () => {
  assert.ok(semver.validRange(range), `engines.node is not a range: ${range}`)
  const narrower = []
  for (const [key, entry] of Object.entries(lock.packages)) {
    const theirs = entry.engines && entry.engines.node
    if (key === '' || !theirs) continue
    if (!semver.subset(range, theirs)) narrower.push(`${key} wants node ${theirs}`)
  }
  assert.deepEqual(narrower, [], `packages that would print EBADENGINE on some Node.js in ${range}`)
  assert.deepEqual(lock.packages[''].engines, pkg.engines)
})

test('this Node.js is one engines admits', () => {
  assert.ok(semver.satisfies(process.versions.node, range), `${process.versions.node} is not in ${range}`)
})

test("./x's check (scripts/check-node.js) reads the range as semver does", () => {
  const versions = new Set(['18.20.4', '19.9.0', '21.7.3', '23.0.0', '25.2.1', '30.0.0', process.versions.node])
  for (const alt of range.split('||')) {
    const v = semver.minVersion(alt.trim())
    for (const next of [v.version, semver.inc(v, 'patch'), semver.inc(v, 'minor'), semver.inc(v, 'major')]) versions.add(next)
    if (v.patch > 0) versions.add(`${v.major}.${v.minor}.${v.patch - 1}`)
    if (v.minor > 0) versions.add(`${v.major}.${v.minor - 1}.99`)
  }
  for (const v of versions) assert.equal(supported(v), semver.satisfies(v, range), v)
  assert.throws(() => supported('20.19.0', '~20.19.0'), /cannot read/)
  const x = fs.readFileSync(path.join(here, '..', '..', 'x'), 'utf8')
  assert.match(x, /scripts\/check-node\.js/, './x checks the Node.js version with scripts/check-node.js')
})

test('docs/node.md states the same range', () => {
  const doc = fs.readFileSync(path.join(here, '..', '..', 'docs', 'node.md'), 'utf8')
  assert.ok(doc.includes(`\`${range}\``), `docs/node.md does not show \`${range}\``)
})
