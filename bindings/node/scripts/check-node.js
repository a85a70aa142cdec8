#!/usr/bin/env node
// Whether a Node.js version is one the binding supports, read from the one
// place that states it: `engines.node` in package.json. ./x runs this
// before `npm ci`, when no package (semver among them) is installed yet, so
// it reads only the forms that range is written in: alternatives joined by
// `||`, each `^X.Y.Z` or `>=X.Y.Z`. Any other form is an error rather than
// a guess; test/install.test.js checks the answers against semver.
//
//   node scripts/check-node.js [VERSION]   exit 0 if VERSION (default: this
//                                           node) is supported, 1 if not
'use strict'
const path = require('node:path')

const range = require(path.join(__dirname, '..', 'package.json')).engines.node

function parse(v) {
  const m = /^v?(\d+)\.(\d+)\.(\d+)$/.exec(v.trim())
  if (!m) throw new Error(`not a version: ${v}`)
  return [Number(m[1]), Number(m[2]), Number(m[3])]
}

function compare(a, b) {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] - b[i]
  return 0
}

/** Whether `version` ("20.19.0" or "v20.19.0") is in `range`. */
function supported(version, r = range) {
  const v = parse(version)
  return r.split('||').some((alt) => {
    const m = /^\s*(\^|>=)\s*(\d+\.\d+\.\d+)\s*$/.exec(alt)
    if (!m) throw new Error(`scripts/check-node.js cannot read the engines range part "${alt.trim()}"`)
    const low = parse(m[2])
    // `^X.Y.Z` with X > 0 is >= X.Y.Z and < X+1.0.0.
    return compare(v, low) >= 0 && (m[1] === '>=' || v[0] === low[0])
  })
}

module.exports = { range, supported }

if (require.main === module) {
  const version = process.argv[2] || process.versions.node
  if (!supported(version)) {
    console.error(`the Node binding needs Node.js ${range} (package.json "engines"); found ${version}`)
    process.exit(1)
  }
}
