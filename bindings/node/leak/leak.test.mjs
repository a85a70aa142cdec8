// No leak across the boundary: after a warm-up, resident memory stays
// within 10% over 100,000 signatures and 2,000 CP-ABE decrypts. Run with
// `npm run test:leak` (node --expose-gc), apart from `npm test` for time.
import test from 'node:test'
import assert from 'node:assert/strict'
import crypto from 'node:crypto'
import { createRequire } from 'node:module'

const kf = createRequire(import.meta.url)('..')

async function settle() {
  for (let i = 0; i < 3; i++) {
    global.gc()
    await new Promise((r) => setTimeout(r, 50))
  }
  return process.memoryUsage().rss
}

test('resident memory stays within 10% over 100,000 signatures and 2,000 decrypts', { timeout: 600000 }, async () => {
  assert.equal(typeof global.gc, 'function', 'run with --expose-gc')
  const pem = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' })
  const engine = new kf.sign.Engine()
  const sk = kf.sign.PrivateKey.fromPem(pem)
  const { publicKey, masterKey } = await kf.abe.setup()
  const key = await kf.abe.keygen(masterKey, { region: 'EU', country: 'FR' })
  const ct = await kf.abe.encrypt(publicKey, 'region: EU and not country: DE', Buffer.alloc(64, 7))
  const data = Buffer.alloc(32, 1)

  async function signatures(n) {
    for (let done = 0; done < n; done += 1000) {
      await Promise.all(Array.from({ length: 1000 }, () => engine.sign(sk, 'ecdsa-p256-sha256', data)))
    }
  }
  async function decrypts(n) {
    for (let done = 0; done < n; done += 8) {
      await Promise.all(Array.from({ length: 8 }, () => kf.abe.decrypt(key, ct)))
    }
  }

  // Warm up with a round of the same size: V8's heap limits and the
  // allocator's per-thread arenas settle at the size the load needs, after
  // which a leak shows as growth and noise does not (a 20,000-signature
  // warm-up left 17% of growth to V8 and malloc on one CI run).
  await signatures(100000)
  await decrypts(2000)
  const before = await settle()
  await signatures(100000)
  await decrypts(2000)
  const after = await settle()
  const growth = (after - before) / before
  console.log(`rss ${(before / 2 ** 20).toFixed(1)} MiB -> ${(after / 2 ** 20).toFixed(1)} MiB (${(growth * 100).toFixed(1)}%)`)
  assert.ok(growth <= 0.1, `resident memory grew ${(growth * 100).toFixed(1)}%`)
  assert.equal(engine.metrics().ec.completed, 200000)
  engine.close()
})
