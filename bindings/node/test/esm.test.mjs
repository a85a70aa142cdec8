// keyfence from an ES module, as another project that installed it writes
// it: named imports (`import { sign } from 'keyfence'`), the default
// import, and a namespace import all work at runtime, and the same code
// type-checks with `tsc --strict` under `module: nodenext`, in an ES
// module and in a CommonJS one. Before, TypeScript accepted the named
// import and Node refused it ("Named export 'sign' not found").
import test from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'

// Named imports from this package, by path, as the CommonJS lexer sees it.
import { KeyfenceError, abe, policy, sign, version, wrap } from '../index.js'
import kfDefault from '../index.js'

const here = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const kf = createRequire(import.meta.url)('..')

test('the named exports are the CommonJS exports', () => {
  assert.equal(KeyfenceError, kf.KeyfenceError)
  assert.equal(sign, kf.sign)
  assert.equal(abe, kf.abe)
  assert.equal(wrap, kf.wrap)
  assert.equal(policy, kf.policy)
  assert.equal(version, kf.version)
  assert.equal(kfDefault, kf)
})

// One source, run as an ES module and type-checked as TypeScript: every
// export by name, the default import and the namespace import.
const esm = `import { KeyfenceError, abe, policy, sign, version, wrap } from 'keyfence'
import kf from 'keyfence'
import * as ns from 'keyfence'
import crypto from 'node:crypto'

const ok: boolean = policy.check('region: EU', new Map([['region', 'EU']]))
const { publicKey, masterKey }: abe.AuthorityKeys = await abe.setup()
const key: abe.AttributeKey = await abe.keygen(masterKey, { region: 'EU' })
const ct: Buffer = await abe.encrypt(publicKey, 'region: EU', new TextEncoder().encode('hello'))
const engine = new sign.Engine({ timeoutMs: 1000 })
const sk: sign.PrivateKey = sign.PrivateKey.fromPem(crypto.generateKeyPairSync('ed25519').privateKey)
const sig: Buffer = await engine.sign(sk, 'ed25519', new Uint8Array([1, 2, 3]), { signal: AbortSignal.timeout(5000) })
engine.close()
let code = ''
try {
  policy.check('a: b or', {})
} catch (e) {
  if (e instanceof KeyfenceError) code = e.code
}
const m: typeof wrap.Machine = kf.wrap.Machine
console.log([
  ok,
  (await abe.decrypt(key, ct)).toString(),
  sig.length,
  code,
  typeof version(),
  kf.sign === sign && ns.sign === sign && ns.default === kf,
  typeof m,
].join(' '))
`
const expected = 'true hello 64 POLICY_SYNTAX string true function\n'

const cjs = `import kf = require('keyfence')
import { sign, policy } from 'keyfence'

const ok: boolean = policy.check('region: EU', { region: 'EU' })
const engine: kf.sign.Engine = new sign.Engine()
engine.close()
console.log(ok, kf.sign === sign)
`

function consumer(t) {
  const project = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-esm-'))
  t.after(() => fs.rmSync(project, { recursive: true, force: true }))
  fs.mkdirSync(path.join(project, 'node_modules'))
  fs.symlinkSync(here, path.join(project, 'node_modules', 'keyfence'), 'dir')
  fs.writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }))
  return project
}

const node = (cwd, file) => execFileSync(process.execPath, [file], { cwd, encoding: 'utf8', timeout: 60000 })

test('import { sign } from \'keyfence\' works in another project\'s ES module', (t) => {
  const project = consumer(t)
  // The TypeScript source less its type annotations is the JavaScript.
  const js = esm
    .replace(/: (boolean|Buffer|abe\.AuthorityKeys|abe\.AttributeKey|sign\.PrivateKey|typeof wrap\.Machine)(?= =)/g, '')
  fs.writeFileSync(path.join(project, 'main.mjs'), js)
  assert.equal(node(project, 'main.mjs'), expected)
})

test('the same code type-checks with tsc --strict, module nodenext, as ESM and as CommonJS, and runs', (t) => {
  const project = consumer(t)
  fs.writeFileSync(path.join(project, 'main.ts'), esm)
  fs.writeFileSync(path.join(project, 'legacy.cts'), cjs)
  fs.writeFileSync(
    path.join(project, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        strict: true,
        module: 'nodenext',
        moduleResolution: 'nodenext',
        target: 'es2022',
        outDir: 'out',
        types: ['node'],
        typeRoots: [path.join(here, 'node_modules', '@types')],
        skipLibCheck: false,
      },
      files: ['main.ts', 'legacy.cts'],
    }),
  )
  const tsc = path.join(here, 'node_modules', 'typescript', 'bin', 'tsc')
  try {
    execFileSync(process.execPath, [tsc, '-p', 'tsconfig.json'], { cwd: project, encoding: 'utf8' })
  } catch (e) {
    assert.fail(`tsc failed:\n${e.stdout}${e.stderr}`)
  }
  // What tsc emitted runs: the types promised nothing the runtime lacks.
  assert.equal(node(project, path.join('out', 'main.js')), expected)
  assert.equal(node(project, path.join('out', 'legacy.cjs')), 'true true\n')
})
