#!/usr/bin/env node
// The npm packages of a release, in the layout napi-rs gives prebuilt
// addons (`napi create-npm-dirs` / `napi prepublish`): the main package
// `keyfence` (the JavaScript, the types, the generated loader binding.js)
// and one platform package per target, here `keyfence-linux-x64-gnu` (the
// addon and the key process beside it, where the core looks for it),
// which the main package names in `optionalDependencies` so npm installs
// only the one whose os/cpu/libc fit. binding.js already loads
// `keyfence-linux-x64-gnu` when no addon lies beside it.
//
//   node release/npm-packages.js OUT_DIR
//
// Reads what `npm run build` left in bindings/node; writes OUT_DIR/keyfence
// and OUT_DIR/keyfence-linux-x64-gnu, ready for `npm pack`.
'use strict'
const fs = require('node:fs')
const path = require('node:path')

const root = path.resolve(__dirname, '..')
const node = path.join(root, 'bindings', 'node')
const out = path.resolve(process.argv[2] || path.join(root, 'dist', 'npm'))
const main = JSON.parse(fs.readFileSync(path.join(node, 'package.json'), 'utf8'))
const platform = { suffix: 'linux-x64-gnu', os: ['linux'], cpu: ['x64'], libc: ['glibc'] }
const addon = `${main.napi.binaryName}.${platform.suffix}.node`
const legal = ['LICENSE-APACHE', 'LICENSE-MIT', 'THIRD-PARTY-NOTICES.txt']

function copy(from, dir, name = path.basename(from), mode) {
  if (!fs.existsSync(from)) throw new Error(`missing ${from} (run npm run build in bindings/node first)`)
  fs.copyFileSync(from, path.join(dir, name))
  if (mode) fs.chmodSync(path.join(dir, name), mode)
}

function write(dir, pkg, readme) {
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify(pkg, null, 2) + '\n')
  fs.writeFileSync(path.join(dir, 'README.md'), readme)
  for (const f of legal) copy(path.join(root, f), dir)
}

fs.rmSync(out, { recursive: true, force: true })
const common = {
  version: main.version,
  license: main.license,
  repository: main.repository,
  engines: main.engines,
}

// The platform package: the addon and the key process, nothing to build.
const platName = `${main.name}-${platform.suffix}`
const platDir = path.join(out, platName)
fs.mkdirSync(platDir, { recursive: true })
copy(path.join(node, addon), platDir)
copy(path.join(node, 'keyfence-key-process'), platDir, 'keyfence-key-process', 0o755)
write(platDir, {
  name: platName,
  ...common,
  description: `The ${platform.suffix} addon of keyfence (installed by the keyfence package; not used alone).`,
  main: addon,
  files: [addon, 'keyfence-key-process', ...legal],
  os: platform.os,
  cpu: platform.cpu,
  libc: platform.libc,
}, `# ${platName}\n\nThe prebuilt ${platform.suffix} addon of [keyfence](https://www.npmjs.com/package/keyfence), with its key process. Install \`keyfence\`, not this package.\n`)

// The main package: no addon of its own, no install script.
const mainDir = path.join(out, main.name)
fs.mkdirSync(mainDir, { recursive: true })
for (const f of ['index.js', 'index.d.ts', 'binding.js']) copy(path.join(node, f), mainDir)
write(mainDir, {
  name: main.name,
  ...common,
  description: main.description,
  main: main.main,
  types: main.types,
  files: ['index.js', 'index.d.ts', 'binding.js', ...legal],
  optionalDependencies: { [platName]: main.version },
}, `# keyfence\n\n${main.description}.\n\nPrebuilt for ${platform.suffix} (the \`${platName}\` package, installed with this one). See docs/node.md in the keyfence repository for the API.\n`)
console.log(out)
