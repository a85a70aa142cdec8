'use strict'
// The example in docs/node.md runs as shown, from another project that
// installed this folder as `keyfence`, and prints what its comments say.
const test = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const here = path.resolve(__dirname, '..')
const doc = fs.readFileSync(path.join(here, '..', '..', 'docs', 'node.md'), 'utf8')

test('the example of docs/node.md runs in another project', (t) => {
  const blocks = [...doc.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1])
  const example = blocks.find((b) => b.includes('async function main'))
  assert.ok(example, 'docs/node.md has the example')
  const project = fs.mkdtempSync(path.join(os.tmpdir(), 'keyfence-consumer-'))
  t.after(() => fs.rmSync(project, { recursive: true, force: true }))
  fs.mkdirSync(path.join(project, 'node_modules'))
  fs.symlinkSync(here, path.join(project, 'node_modules', 'keyfence'), 'dir')
  fs.writeFileSync(path.join(project, 'example.js'), example)
  const out = execFileSync(process.execPath, ['example.js'], { cwd: project, encoding: 'utf8', timeout: 60000 })
  const expected = [...example.matchAll(/console\.log\(.*\) \/\/ (.*)$/gm)].map((m) => m[1])
  assert.deepEqual(out.trim().split('\n'), expected)
})
