"""The installed wheel, used as a user would: CP-ABE on CIRCL's bytes,
wrap and open, and a signature from the key process that
pyca/cryptography verifies. Run with the toolchains hidden from PATH.

Usage: python smoke.py VECTORS_DIR WORK_DIR  (prints the version)
"""

import asyncio
import pathlib
import sys

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

import keyfence


def loaded_from_inside(prefix: pathlib.Path) -> None:
    """libkeyfence and the extension come from the installed package, not a build tree."""
    maps = pathlib.Path("/proc/self/maps").read_text().splitlines()
    libs = {line.split()[-1] for line in maps if "libkeyfence" in line or "keyfence/_core" in line}
    if not libs:
        raise SystemExit("libkeyfence is not mapped into this process")
    outside = [p for p in libs if not pathlib.Path(p).resolve().is_relative_to(prefix.resolve())]
    if outside:
        raise SystemExit(f"loaded from outside {prefix}: {outside}")


async def main() -> None:
    vectors, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    loaded_from_inside(pathlib.Path(sys.prefix))

    ok = vectors / "ok"
    key = keyfence.abe.AttributeKey.from_bytes((ok / "attribute_key.bin").read_bytes())
    keyfence.abe.PublicKey.from_bytes((ok / "public_key.bin").read_bytes())
    plain = keyfence.abe.decrypt(key, (ok / "ciphertext.bin").read_bytes())
    assert plain == (ok / "plaintext.bin").read_bytes(), "CIRCL ciphertext decrypted to other bytes"
    refused = vectors / "refused"
    other = keyfence.abe.AttributeKey.from_bytes((refused / "attribute_key.bin").read_bytes())
    try:
        keyfence.abe.decrypt(other, (refused / "ciphertext.bin").read_bytes())
        raise SystemExit("a key outside the policy decrypted")
    except keyfence.PolicyNotSatisfied:
        pass

    store = work / "store"
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    auth = keyfence.wrap.Authority.init(str(store))
    envelope = auth.wrap("region: EU and not country: DE", pem)
    machine = keyfence.wrap.Machine(auth.issue({"region": "EU", "country": "FR"}), str(store))
    assert machine.open(envelope) == pem, "the envelope opened to other bytes"

    # The key process ships inside the package, beside libkeyfence.
    engine = keyfence.sign.Engine(isolated=True)
    sk = keyfence.sign.PrivateKey.from_envelope(machine, envelope, engine=engine)
    data = b"release smoke test"
    sig = await engine.sign(sk, "ecdsa-p256-sha256", data)
    private.public_key().verify(sig, data, ec.ECDSA(hashes.SHA256()))  # raises if wrong
    engine.close()
    print(keyfence.__version__)


asyncio.run(main())
