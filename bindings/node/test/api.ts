// Type-checked by test/types.test.js with `tsc --noEmit`: every part of the
// API as a TypeScript user writes it, against the generated index.d.ts.
import * as crypto from 'node:crypto'
import * as kf from '..'

export async function everything(dir: string, pem: string): Promise<void> {
  const v: string = kf.version()
  const ok: boolean = kf.policy.check('region: EU', { region: 'EU' }) && kf.policy.check('region: EU', new Map([['region', 'EU']]))
  const attrs: kf.Attributes = new Map<string, string>()
  const bytes: kf.Bytes[] = [Buffer.alloc(1), new Uint16Array(1), new DataView(new ArrayBuffer(1)), new ArrayBuffer(1)]
  const canonical: string = kf.policy.canonical('region:EU')

  const { publicKey, masterKey }: kf.abe.AuthorityKeys = await kf.abe.setup()
  const key: kf.abe.AttributeKey = await kf.abe.keygen(masterKey, { country: 'FR', region: 'EU' })
  const ct: Buffer = await kf.abe.encrypt(publicKey, 'region: EU', Buffer.from('...'))
  const pt: Buffer = await kf.abe.decrypt(key, ct)
  const pt2: Buffer = kf.abe.decryptSync(key, kf.abe.encryptSync(publicKey, 'region: EU', new Uint8Array(3)))
  const sync = kf.abe.setupSync()
  const k2: kf.abe.AttributeKey = kf.abe.keygenSync(sync.masterKey, { a: 'b' })
  const pk: kf.abe.PublicKey = kf.abe.PublicKey.fromBytes(publicKey.toBytes())
  const msk: kf.abe.MasterKey = kf.abe.MasterKey.fromBytes(masterKey.toBytes())
  const ak: kf.abe.AttributeKey = kf.abe.AttributeKey.fromBytes(key.toBytes())
  const labels: string[] = ak.labels
  const could: boolean = kf.abe.couldDecrypt(attrs, new DataView(ct.buffer, ct.byteOffset, ct.length))
  const policy: string = kf.abe.policyOf(ct)

  const auth: kf.wrap.Authority = await kf.wrap.Authority.init(dir)
  const again: kf.wrap.Authority = await kf.wrap.Authority.open(dir)
  const authSync: kf.wrap.Authority = kf.wrap.Authority.openSync(dir)
  const env: Buffer = await auth.wrap('region: EU', Buffer.from('secret'))
  const machineKey: Buffer = await auth.issue({ region: 'EU' })
  const rotation: kf.wrap.MasterRotation = await auth.rotateMaster()
  const n: number = rotation.resealed + rotation.generation
  const m = new kf.wrap.Machine(machineKey, dir)
  const kept = new kf.wrap.Machine(machineKey, dir, { state: `${dir}/machine.key.newest` })
  const floor: Buffer = m.newestLists()
  kept.require(floor)
  const yes: boolean = m.couldOpen(env)
  const secret: Buffer = await m.open(env)
  const secret2: Buffer = m.openSync(auth.wrapSync('a: b', Buffer.from('x')))
  const mk: Buffer = auth.issueSync({ a: 'b' })
  const r2: kf.wrap.MasterRotation = again.rotateMasterSync()

  const engine = new kf.sign.Engine({ isolated: false, ec: { threads: 2, queueCapacity: 1024 }, timeoutMs: 1000 })
  const sk: kf.sign.PrivateKey = kf.sign.PrivateKey.fromPem(pem)
  const sk2: kf.sign.PrivateKey = kf.sign.PrivateKey.fromPem(Buffer.from(pem))
  const sk3: kf.sign.PrivateKey = kf.sign.PrivateKey.fromPem(crypto.createPrivateKey(pem))
  const held2: kf.sign.PrivateKey = engine.loadKey(crypto.createPrivateKey(pem))
  const held: kf.sign.PrivateKey = engine.loadKey(pem)
  const sig: Buffer = await engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('data'), { timeoutMs: 50 })
  await engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('data'), { signal: new AbortController().signal })
  await engine.sign(sk, 'ecdsa-p256-sha256', new ArrayBuffer(4), { signal: AbortSignal.timeout(100), timeoutMs: 50 })
  try {
    await engine.sign(sk, 'ecdsa-p256-sha256', Buffer.from('data'), { signal: AbortSignal.abort() })
  } catch (e) {
    if (e instanceof kf.KeyfenceError && e.name === 'AbortError') void e.code
  }
  // @ts-expect-error signSync cannot be aborted: its options have no signal
  engine.signSync(sk, 'ecdsa-p256-sha256', Buffer.from('data'), { signal: new AbortController().signal })
  // @ts-expect-error the generated loader's marker is no export of keyfence
  void kf.__napiBindingTarget
  const remote = new kf.sign.RemoteSigner({
    peers: [{ name: 'sfo1', address: '127.0.0.1:7543', attributes: { country: 'US' } }],
    cert: 'c.pem', key: 'c.key', ca: 'ca.pem', requestTimeoutMs: 500,
  })
  const rk: kf.sign.PrivateKey = await remote.key(Buffer.from('envelope'))
  const text: string = remote.metrics() + engine.metricsPrometheus()
  engine.attachRemote(remote)
  void rk, text
  const sig2: Buffer = engine.signSync(sk2, 'ecdsa-p256-sha256', Buffer.from('data'))
  const metrics: kf.sign.EngineMetrics = engine.metrics()
  const p99: number = metrics.ec.latency.p99
  const overloaded: number = metrics.ec.errors.overloaded + metrics.ec.errors.timedOut + metrics.ec.errors.shutDown
  const spki: Buffer = held.publicKeyDer()
  const kind: string = sk.kind
  const isolated: boolean = engine.isolated
  const pid: number | null | undefined = engine.keyProcessPid
  const opened: kf.sign.PrivateKey = engine.loadEnvelope(dir, 'machine.key', env)
  engine.close()

  const onDevice = new kf.sign.Engine({ isolated: true, offload: 'auto', cryptoMb: '/usr/local/lib/keyfence-crypto-mb/libcrypto_mb.so.13' })
  onDevice.close()
  // @ts-expect-error an offload mode is 'off', 'on' or 'auto'
  void new kf.sign.Engine({ offload: 'maybe' })

  const tokens = new kf.sign.Engine({ isolated: true, token: { threads: 4, queueCapacity: 256 } })
  const tokenKey: kf.sign.PrivateKey = tokens.loadPkcs11('pkcs11:token=edge;object=tls-p256?pin-source=file:/etc/keyfence/pin')
  const tokenSig: Buffer = await tokens.sign(tokenKey, 'ecdsa-p256-sha256', Buffer.from('data'))
  const tokenOps: number = tokens.metrics().token.completed
  tokens.close()

  const viaAgent = new kf.sign.Engine({ agent: '/run/keyfence/agent.sock', timeoutMs: 1000 })
  const socket: string | null = viaAgent.agent
  const agentKey: kf.sign.PrivateKey = viaAgent.loadEnvelope(env)
  const agentSig: Buffer = await viaAgent.sign(agentKey, 'ecdsa-p256-sha256', Buffer.from('data'))
  viaAgent.close()

  try {
    kf.policy.check('a: b or', {})
  } catch (e) {
    if (e instanceof kf.KeyfenceError) {
      const code: string = e.code
      const position: number | undefined = e.position
      void [code, position]
    }
  }
  void [bytes, sk3, held2]
  void [v, ok, canonical, pt, pt2, k2, pk, msk, labels, could, policy, authSync, n, yes, secret, secret2, mk, r2, sig, sig2, p99, overloaded, spki, kind, isolated, pid, opened, socket, agentSig, tokenSig, tokenOps]
}
