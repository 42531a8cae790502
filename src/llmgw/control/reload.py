"""A reload is all or nothing: server.yaml read and checked whole, every part prepared, then all switched.

SIGHUP and ``llmgw ctl reload`` both come here.  The parts of the server
that take a new configuration — the catalog first, then every registered
listener (the server's own router) — each *prepare*: check the new
configuration against what they are running and build what they would
switch to.  Only when every one has accepted does any of them apply, so a
refusal anywhere leaves every part on the old configuration, and the log
and ``ctl reload`` say which part refused and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from twisted.logger import Logger

from llmgw.config.server import ServerConfig
from llmgw.control.catalog import Catalog
from llmgw.errors import ConfigError, LlmgwError, PKIError
from llmgw.link.tls import HubTLS, load_revocations

log = Logger()

REFUSED = "reload refused, the old catalog stays"

# Switches a part over; may return one sentence for the reload's list of
# changes ("revocation list …: 1 certificate revoked (+1); 1 connection closed").
Apply = Callable[[], "str | None"]


@attrs.frozen
class Listener:
    """A part of the server that takes its share of a reloaded server.yaml.

    ``prepare(config)`` refuses by raising an LlmgwError whose message says
    what is wrong and what to do; otherwise it returns the function that
    switches the part over.  That function must not fail: whatever can fail
    belongs in ``prepare``.
    """

    name: str  # as the log says it: "the router refused it: ..."
    prepare: Callable[[ServerConfig], Apply]
    # The sections (or ``section.key``) of server.yaml it applies, for the
    # reload's summary: a change to one nothing applies waits for a restart.
    applies: tuple[str, ...] = ()


@attrs.frozen
class Outcome:
    """What a reload did: the changes it applied, or the one sentence saying why it applied none."""

    changes: tuple[str, ...] = ()
    refused: str | None = None


def reload_all(catalog: Catalog, listeners: Sequence[Listener]) -> Outcome:
    """Read server.yaml again and hand it to the catalog and every listener, or to none of them."""
    try:
        new = catalog.read()
    except ConfigError as e:
        return _refused(str(e))
    changes = catalog.changes(new, applied=[key for listener in listeners for key in listener.applies])
    applies: list[tuple[str, Apply]] = [("the catalog", catalog.prepare(new))]
    for listener in listeners:
        try:
            applies.append((listener.name, listener.prepare(new)))
        except LlmgwError as e:
            return _refused(f"{listener.name} refused it: {e}")
        except Exception as e:
            # A bug, not a verdict on the file: still nothing is applied, and the
            # traceback goes to the log for whoever fixes it.
            log.failure("{name} failed while preparing the reload", name=listener.name)
            return _refused(f"{listener.name} failed on it ({type(e).__name__}: {e}); the server log has the traceback")
    for name, apply in applies:
        try:
            said = apply()
        except Exception:
            log.critical("{name} failed to apply a reload every part had accepted; parts may now run different "
                         "configurations: restart the server", name=name)
            raise
        if said:
            changes.append(said)
    log.info("catalog reloaded: {changes}", changes="; ".join(changes) or "no changes")
    return Outcome(tuple(changes))


def _refused(why: str) -> Outcome:
    sentence = f"{REFUSED}: {why}"
    log.error("{sentence}", sentence=sentence)
    return Outcome(refused=sentence)


def revocation_listener(tls: HubTLS) -> Listener:
    """The hub's revocation list as a part of the reload: read again, checked, then swapped in.

    A list that is unreadable or not signed by the cluster CA refuses the
    reload, as would a list that was read before and is now gone: either would
    otherwise let revoked certificates back in.  Once applied, the next
    handshake is checked against it, and open connections it revokes are closed.
    """

    def prepare(config: ServerConfig) -> Apply:
        new = load_revocations(config.tls)
        old = tls.revocations
        if new.path is None and old.path is not None:
            raise PKIError(
                f"{old.path} is gone, and the hub would forget the {len(old)} certificates it revokes; "
                "put it back (`llmgw pki revoke` writes it in the CA's directory), or name another in tls.crl"
            )

        def apply() -> str | None:
            closed = tls.replace(new)
            if new.path is None or (new.number, new.path) == (old.number, old.path):
                return None
            said = (f"revocation list {new.path}: {len(new)} certificates revoked ({len(new) - len(old):+d}); "
                    f"{len(closed)} connections closed")
            log.info("{said}", said=said)
            return said

        return apply

    return Listener("the revocation list", prepare, applies=("tls.crl",))
