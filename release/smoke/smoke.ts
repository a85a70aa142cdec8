// The installed package's types, checked by tsc in the consumer project:
// a typo in a name or a wrong argument type fails the release check.
import * as kf from 'keyfence'

async function types(ct: Uint8Array, bytes: Uint8Array): Promise<string> {
  const key: kf.abe.AttributeKey = kf.abe.AttributeKey.fromBytes(bytes)
  const plain: Buffer = await kf.abe.decrypt(key, ct)
  const engine = new kf.sign.Engine({ isolated: true })
  const sk: kf.sign.PrivateKey = engine.loadKey(plain)
  const sig: Buffer = await engine.sign(sk, 'ecdsa-p256-sha256', plain)
  engine.close()
  return kf.version() + sig.length
}
void types
