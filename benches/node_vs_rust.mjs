#!/usr/bin/env node
// Node against Rust, side by side in one run (docs/benchmarks.md, "Node"):
// CP-ABE decrypt from Node (the promise, and its Sync twin) against the
// core called from Rust (`keyfence bench abe`), on CIRCL's benchmark
// shapes; ECDSA P-256 signing throughput through promises against the Rust
// engine (`keyfence bench sign --path engine`). Rounds alternate between
// the two so that drift on a shared machine hits both.
//
//   cargo build --release -p keyfence-cli
//   (cd bindings/node && npm ci && npm run build)
//   node benches/node_vs_rust.mjs [--rounds 3] [--iters 20] [--seconds 3]
import { execFileSync } from 'node:child_process'
import crypto from 'node:crypto'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const kf = createRequire(import.meta.url)(path.join(root, 'bindings', 'node'))
const targetDir = process.env.CARGO_TARGET_DIR || path.join(root, 'target')
const cli = path.join(targetDir, 'release', 'keyfence')

const opt = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`)
  return i < 0 ? dflt : Number(process.argv[i + 1])
}
const rounds = opt('rounds', 3)
const iters = opt('iters', 20)
const seconds = opt('seconds', 3)
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]

// The shapes of `keyfence bench abe` (bindings/cli/src/bench_cmd.rs).
const clauses = (neg, op) => Array.from({ length: 50 }, (_, i) => (neg && i % 2 === 1 ? `not a${i}: x${i}` : `a${i}: v${i}`)).join(op)
const all = Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`a${i}`, `v${i}`]))
const cases = [
  ['small', 'country: US or region: EU', { country: 'FR', region: 'EU' }],
  ['and50', clauses(false, ' and '), all],
  ['or50', clauses(false, ' or '), all],
  ['and50neg25', clauses(true, ' and '), all],
]

function rustAbe() {
  const out = execFileSync(cli, ['bench', 'abe', '--json', '--iters', String(iters)], { encoding: 'utf8' })
  return Object.fromEntries(out.trim().split('\n').map((l) => JSON.parse(l)).map((r) => [r.case, r.decrypt_ms]))
}

async function nodeAbe() {
  const { publicKey, masterKey } = kf.abe.setupSync()
  const msg = Buffer.from('a 23-byte test message!')
  const res = {}
  for (const [name, policy, attrs] of cases) {
    const key = kf.abe.keygenSync(masterKey, attrs)
    const ct = kf.abe.encryptSync(publicKey, policy, msg)
    const sync = []
    const prom = []
    for (let i = 0; i < iters; i++) {
      let t = performance.now()
      kf.abe.decryptSync(key, ct)
      sync.push(performance.now() - t)
      t = performance.now()
      await kf.abe.decrypt(key, ct)
      prom.push(performance.now() - t)
    }
    res[name] = { sync: median(sync), promise: median(prom) }
  }
  return res
}

function rustSign() {
  const out = execFileSync(cli, ['bench', 'sign', '--json', '--case', 'ecdsa-p256-sha256', '--path', 'engine', '--seconds', String(seconds)], { encoding: 'utf8' })
  const rows = out.trim().split('\n').map((l) => JSON.parse(l))
  return rows.find((r) => r.path === 'engine').ops_per_s
}

async function nodeSign() {
  const pem = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' })
  const engine = new kf.sign.Engine()
  const sk = kf.sign.PrivateKey.fromPem(pem)
  const msg = Buffer.alloc(130, 0x20)
  const inFlight = 1024
  let done = 0
  const end = performance.now() + seconds * 1000
  const start = performance.now()
  async function lane() {
    while (performance.now() < end) {
      await engine.sign(sk, 'ecdsa-p256-sha256', msg)
      done++
    }
  }
  await Promise.all(Array.from({ length: inFlight }, lane))
  const ops = done / ((performance.now() - start) / 1000)
  engine.close()
  return ops
}

const abe = { rust: {}, sync: {}, promise: {} }
const sign = { rust: [], node: [] }
for (let r = 0; r < rounds; r++) {
  const rust = rustAbe()
  const node = await nodeAbe()
  for (const [name] of cases) {
    ;(abe.rust[name] ??= []).push(rust[name])
    ;(abe.sync[name] ??= []).push(node[name].sync)
    ;(abe.promise[name] ??= []).push(node[name].promise)
  }
  sign.rust.push(rustSign())
  sign.node.push(await nodeSign())
  process.stderr.write(`round ${r + 1}/${rounds} done\n`)
}

console.log(`CP-ABE decrypt, median of ${rounds} rounds of ${iters}-iteration medians (ms)`)
console.log('| case | Rust ms | Node decryptSync ms | ratio | Node await decrypt ms | ratio | target |')
console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: |')
for (const [name] of cases) {
  const rs = median(abe.rust[name])
  const s = median(abe.sync[name])
  const p = median(abe.promise[name])
  console.log(`| ${name} | ${rs.toFixed(2)} | ${s.toFixed(2)} | ${(s / rs).toFixed(2)}x | ${p.toFixed(2)} | ${(p / rs).toFixed(2)}x | <= 1.15x |`)
}
const rs = median(sign.rust)
const ns = median(sign.node)
console.log(`\nECDSA P-256 signing throughput, median of ${rounds} rounds of ${seconds} s`)
console.log('| Rust engine ops/s | Node promises ops/s | ratio | target |')
console.log('| ---: | ---: | ---: | ---: |')
console.log(`| ${rs.toFixed(0)} | ${ns.toFixed(0)} | ${(ns / rs).toFixed(2)}x | >= 0.5x |`)
