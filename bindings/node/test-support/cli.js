'use strict'
// What the tests that run the `keyfence` command line share (kept out of
// test/, where `node --test` would run it as a test file of its own).
const { execFileSync } = require('node:child_process')
const path = require('node:path')

const repo = path.resolve(__dirname, '..', '..', '..')

/**
 * The `keyfence` command line: the one `./x test` built and passes in
 * KEYFENCE_CLI, or, run alone, cargo's debug build (built here if needed).
 */
function cli() {
  if (process.env.KEYFENCE_CLI) return process.env.KEYFENCE_CLI
  execFileSync('cargo', ['build', '--locked', '-q', '-p', 'keyfence-cli', '--bin', 'keyfence'], { cwd: repo, stdio: 'inherit' })
  return path.join(process.env.CARGO_TARGET_DIR || path.join(repo, 'target'), 'debug', 'keyfence')
}

module.exports = { cli, repo }
