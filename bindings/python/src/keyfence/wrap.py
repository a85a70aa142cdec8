"""Policy-key wrapping of customer secrets on a store many machines share.

The authority (:class:`Authority`) wraps secrets under policies and issues
machine keys; each machine (:class:`Machine`) opens the envelopes its
attributes allow, reading sealed policy keys from the replicated store::

    auth = keyfence.wrap.Authority.init("/srv/keyfence")
    envelope = auth.wrap("region: EU", b"customer secret")
    machine = keyfence.wrap.Machine(auth.issue({"region": "EU"}), "/srv/keyfence")
    assert machine.open(envelope) == b"customer secret"

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
