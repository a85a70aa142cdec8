"""Policy-key wrapping of customer secrets on a store many machines share.

The authority (:class:`Authority`) wraps secrets under policies and issues
machine keys; each machine (:class:`Machine`) opens the envelopes its
attributes allow, reading sealed policy keys from the replicated store::

    auth = keyfence.wrap.Authority.init("/srv/keyfence")
    envelope = auth.wrap("region: EU", b"customer secret")
    machine = keyfence.wrap.Machine(auth.issue({"region": "EU"}), "/srv/keyfence")
    assert machine.open(envelope) == b"customer secret"

A store is named by one string: a directory, as above, or
``etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=&cert=&key=]`` for a store
on an etcd cluster. ``machine.follow()`` keeps a machine's cache in step with
the store through a watch (a retired key forgotten at once, a rotated one
opened ahead), and ``machine.cache_stats()`` counts what it did.

See ``docs/wrapping.md`` for formats, rotation and the threat model.
"""

from __future__ import annotations

from . import _core
from ._guard import guard_class

__all__ = ["Authority", "Machine"]

Authority = _core.Authority
Machine = _core.Machine
guard_class(Authority)
guard_class(Machine)
