#!/usr/bin/env node
// Node against Rust, side by side in one run (docs/benchmarks.md, "Node"):
// CP-ABE decrypt from Node (the promise, and its Sync twin) against the
// core called from Rust (`keyfence bench abe`), on CIRCL's benchmark
// shapes; signing through promises (`node-promise`: `await engine.sign`
// from 1,024 lanes) per CPU-second of the whole process
// (process.cpuUsage(): the main thread, libuv's and the engine's threads)
// against raw BoringSSL's in the same round (the `raw` rows of `keyfence
// bench sign --per-cpu`: the library the engine signs with, where Node's
// own crypto is OpenSSL's and would compare two libraries), for ECDSA
// P-256, Ed25519 and RSA-2048 (PSS), and P-256 throughput against the Rust
// engine's. Rounds alternate between Rust and Node so that drift on a
// shared machine hits both. Signing rows are printed in the shape of
// `keyfence bench sign --json --per-cpu` (alg, path, per_cpu_second,
// vs_raw, target), one JSON object per line, before the tables.
//
//   cargo build --release -p keyfence-cli
//   (cd bindings/node && npm ci && npm run build)
//   node benches/node_vs_rust.mjs [--rounds 3] [--iters 20] [--seconds 3] [--only sign]
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
const signOnly = process.argv.includes('--only') && process.argv[process.argv.indexOf('--only') + 1] === 'sign'
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

// The algorithms signed per CPU-second, as `keyfence bench sign` names
// them; issue 29's target for the promise path (P-256 and Ed25519; RSA-2048
// is reported without one).
const signAlgs = ['ecdsa-p256-sha256', 'ed25519', 'rsa2048-pss-sha256']
const perCpuTarget = { 'ecdsa-p256-sha256': 0.8, ed25519: 0.8 }

// Raw BoringSSL and the Rust engine side by side, for one algorithm: rows
// of `keyfence bench sign --json --per-cpu`, for half the Node run's time
// (it runs before and after it).
function rustSign(alg) {
  const args = ['bench', 'sign', '--json', '--per-cpu', '--path', 'engine', '--seconds', String(seconds / 2), '--case', alg]
  return execFileSync(cli, args, { encoding: 'utf8' }).trim().split('\n').map((l) => JSON.parse(l))
}

function keyPem(alg) {
  const [type, opts] = alg === 'ed25519' ? ['ed25519', {}] : alg.startsWith('rsa2048') ? ['rsa', { modulusLength: 2048 }] : ['ec', { namedCurve: 'P-256' }]
  return crypto.generateKeyPairSync(type, opts).privateKey.export({ type: 'pkcs8', format: 'pem' })
}

// CPU time (user and system) of this whole process so far, in seconds.
const cpuSeconds = () => {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1e6
}

async function nodeSign(alg) {
  const engine = new kf.sign.Engine()
  const sk = kf.sign.PrivateKey.fromPem(keyPem(alg))
  // The library's algorithm name (the bench's case names the key size too).
  const name = alg.startsWith('rsa2048') ? 'rsa-pss-sha256' : alg
  const msg = Buffer.alloc(130, 0x20)
  // RSA's default queue holds 256 per core: enough to keep it busy.
  const inFlight = alg.startsWith('rsa') ? 256 : 1024
  let done = 0
  let end = performance.now() + 200
  async function lane() {
    while (performance.now() < end) {
      await engine.sign(sk, name, msg)
      done++
    }
  }
  await Promise.all(Array.from({ length: inFlight }, lane)) // warm-up
  done = 0
  end = performance.now() + seconds * 1000
  const cpu = cpuSeconds()
  const start = performance.now()
  await Promise.all(Array.from({ length: inFlight }, lane))
  const wall = (performance.now() - start) / 1000
  const cpuS = cpuSeconds() - cpu
  engine.close()
  return { ops: done, wall, cpu: cpuS }
}

const abe = { rust: {}, sync: {}, promise: {} }
const sign = { rust: [], node: [] }
const perCpu = Object.fromEntries(signAlgs.map((a) => [a, { raw: [], node: [], vsRaw: [] }]))
for (let r = 0; r < rounds; r++) {
  if (!signOnly) {
    const rust = rustAbe()
    const node = await nodeAbe()
    for (const [name] of cases) {
      ;(abe.rust[name] ??= []).push(rust[name])
      ;(abe.sync[name] ??= []).push(node[name].sync)
      ;(abe.promise[name] ??= []).push(node[name].promise)
    }
  }
  // Per algorithm: raw BoringSSL (and the Rust engine) right before and
  // right after the Node run, and Node against their mean. This host's
  // speed drifts over seconds, so a ratio against a raw figure taken once,
  // earlier, carries the drift.
  for (const alg of signAlgs) {
    const before = rustSign(alg)
    const m = await nodeSign(alg)
    const after = rustSign(alg)
    const mean = (path, field) => (before.find((x) => x.path === path)[field] + after.find((x) => x.path === path)[field]) / 2
    const rawPerCpu = mean('raw', 'per_cpu_second')
    const perCpuSecond = m.ops / m.cpu
    const vsRaw = perCpuSecond / rawPerCpu
    console.log(JSON.stringify({
      round: r, alg, path: 'raw', per_cpu_second: Math.round(rawPerCpu), vs_raw: 1, target: null, ops_per_s: Math.round(mean('raw', 'ops_per_s')),
      per_cpu_second_before: before.find((x) => x.path === 'raw').per_cpu_second,
      per_cpu_second_after: after.find((x) => x.path === 'raw').per_cpu_second,
    }))
    console.log(JSON.stringify({
      round: r, alg, path: 'node-promise', per_cpu_second: Math.round(perCpuSecond), vs_raw: Math.round(vsRaw * 1000) / 1000,
      target: perCpuTarget[alg] ?? null, ops_per_s: Math.round(m.ops / m.wall),
    }))
    perCpu[alg].raw.push(rawPerCpu)
    perCpu[alg].node.push(perCpuSecond)
    perCpu[alg].vsRaw.push(vsRaw)
    if (alg === 'ecdsa-p256-sha256') {
      sign.rust.push(mean('engine', 'ops_per_s'))
      sign.node.push(m.ops / m.wall)
    }
  }
  process.stderr.write(`round ${r + 1}/${rounds} done\n`)
}

if (!signOnly) {
  console.log(`CP-ABE decrypt, median of ${rounds} rounds of ${iters}-iteration medians (ms)`)
  console.log('| case | Rust ms | Node decryptSync ms | ratio | Node await decrypt ms | ratio | target |')
  console.log('| --- | ---: | ---: | ---: | ---: | ---: | ---: |')
  for (const [name] of cases) {
    const rs = median(abe.rust[name])
    const s = median(abe.sync[name])
    const p = median(abe.promise[name])
    console.log(`| ${name} | ${rs.toFixed(2)} | ${s.toFixed(2)} | ${(s / rs).toFixed(2)}x | ${p.toFixed(2)} | ${(p / rs).toFixed(2)}x | <= 1.15x |`)
  }
}
const rs = median(sign.rust)
const ns = median(sign.node)
console.log(`\nECDSA P-256 signing throughput, median of ${rounds} rounds of ${seconds} s`)
console.log('| Rust engine ops/s | Node promises ops/s | ratio | target |')
console.log('| ---: | ---: | ---: | ---: |')
console.log(`| ${rs.toFixed(0)} | ${ns.toFixed(0)} | ${(ns / rs).toFixed(2)}x | >= 0.5x |`)
console.log(`\nSigning per CPU-second, node-promise against raw BoringSSL, median of ${rounds} rounds (range)`)
console.log('| alg | raw / CPU-s | node-promise / CPU-s | vs_raw | range | target |')
console.log('| --- | ---: | ---: | ---: | --- | ---: |')
for (const alg of signAlgs) {
  const p = perCpu[alg]
  const target = perCpuTarget[alg] ? `>= ${perCpuTarget[alg]}x` : ''
  console.log(`| ${alg} | ${median(p.raw).toFixed(0)} | ${median(p.node).toFixed(0)} | ${median(p.vsRaw).toFixed(3)}x | ${Math.min(...p.vsRaw).toFixed(2)}-${Math.max(...p.vsRaw).toFixed(2)} | ${target} |`)
}
