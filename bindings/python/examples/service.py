"""A small asyncio signing service: `id hex` lines in, `id signature` lines out."""

import asyncio
import tempfile

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

import keyfence


async def serve(engine: keyfence.sign.Engine, key: keyfence.sign.PrivateKey) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def one(line: bytes) -> None:
            tag, data = line.split()
            try:
                sig = await engine.sign(key, "ecdsa-p256-sha256", bytes.fromhex(data.decode()))
                writer.write(tag + b" " + sig.hex().encode() + b"\n")
            except keyfence.Overloaded:
                writer.write(tag + b" busy\n")  # shed load at once, never queue without bound

        tasks = []
        while line := await reader.readline():
            tasks.append(asyncio.create_task(one(line.strip())))
        await asyncio.gather(*tasks)
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def main() -> None:
    # The authority wraps the service's private key under a policy ...
    store = tempfile.mkdtemp()
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    authority = keyfence.wrap.Authority.init(store)
    envelope = authority.wrap("region: EU and not country: DE", pem)
    machine_key = authority.issue({"region": "EU", "country": "FR"})

    # ... and a machine whose attributes satisfy it opens the key into the engine.
    machine = keyfence.wrap.Machine(machine_key, store)
    with keyfence.sign.Engine(queue_capacity=1024, timeout=0.5) as engine:
        key = keyfence.sign.PrivateKey.from_envelope(machine, envelope, engine=engine)
        server = await serve(engine, key)
        port = server.sockets[0].getsockname()[1]

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        messages = [f"handshake {i}".encode() for i in range(200)]
        writer.write(b"".join(b"%d %s\n" % (i, m.hex().encode()) for i, m in enumerate(messages)))
        writer.write_eof()
        replies = [await reader.readline() for _ in messages]
        server.close()

    # Replies arrive in completion order, each with its request's id.
    for reply in replies:
        tag, sig = reply.split()
        private.public_key().verify(bytes.fromhex(sig.decode()), messages[int(tag)], ec.ECDSA(hashes.SHA256()))
    print(f"{len(replies)} signatures verified with pyca/cryptography")


if __name__ == "__main__":
    asyncio.run(main())
