#!/usr/bin/env node
// `npm run build`: the addon in release mode with the local cargo and the
// workspace's target directory (CARGO_TARGET_DIR, default <repo>/target),
// its generated loader (binding.js) and types (index.d.ts, less the
// loader's own `__napiBindingTarget`, which index.js does not export), then the
// key process (keyfence-key-process) copied beside the addon, where the
// core looks for it. Nothing is downloaded but crates.
'use strict'
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const here = path.resolve(__dirname, '..')
const root = path.resolve(here, '..', '..')
const targetDir = process.env.CARGO_TARGET_DIR || path.join(root, 'target')
const env = { ...process.env, CARGO_TARGET_DIR: targetDir, CARGO: path.join(__dirname, 'cargo-host') }
const run = (cmd, args, opts = {}) => execFileSync(cmd, args, { stdio: 'inherit', cwd: here, ...opts })

run(path.join(here, 'node_modules', '.bin', 'napi'), [
  'build', '--platform', '--release',
  '--js', 'binding.js', '--dts', 'index.d.ts', '--', '--locked',
], { env })

// The CLI declares `__napiBindingTarget`, which its loader (binding.js)
// exports; index.js, what `require('keyfence')` gives, does not, so the
// declaration would promise a value that is undefined at runtime.
const dts = path.join(here, 'index.d.ts')
const types = fs.readFileSync(dts, 'utf8')
const stripped = types.replace(/\n(\/\*\*(?:(?!\*\/)[\s\S])*\*\/\n)?export declare const __napiBindingTarget\b[^\n]*\n/g, '')
if (/__napiBindingTarget/.test(stripped)) throw new Error('index.d.ts declares __napiBindingTarget in a form scripts/build.js does not remove')
if (stripped !== types) fs.writeFileSync(dts, stripped)

run('cargo', ['build', '--release', '--locked', '-p', 'keyfence', '--bin', 'keyfence-key-process', '--features', 'shipped'], {
  env: { ...process.env, CARGO_TARGET_DIR: targetDir },
})
const keyProcess = path.join(here, 'keyfence-key-process')
fs.rmSync(keyProcess, { force: true })
fs.copyFileSync(path.join(targetDir, 'release', 'keyfence-key-process'), keyProcess)
fs.chmodSync(keyProcess, 0o755)
