"""What the control plane answers an operator's command: records, as ``llmgw.views`` holds what it shows of the fleet.

ctl, the dashboard and the admin page send a command (cordon, drain,
reload, logs, weights, and onboarding's three) and read the answer with
``from_wire``, which refuses one that does not fit and names the field.  The
wire form is ``to_wire`` of the record: its field names are the JSON keys
these answers have always had, so an older reader that reads them by key
still reads them (``docs/link.rst``, "Compatibility of views").
"""

from __future__ import annotations

import attrs

from llmgw.records import IDENT, NAME, PROSE, CollectResult, WeightsFile
from llmgw.wire import Text, field

#: The most shards one node holds, as its inventory may list them: what a drain can stop.
NODE_SHARDS = 1024
#: The most changes one reload names.
RELOAD_CHANGES = 100_000
#: The most lines ``llmgw.cp.logs`` relays: the agent's own cap on ``n``.
LOG_LINES = 10_000
#: A node's log sources: the agent's own and one per shard it runs.
LOG_SOURCES = 1024
#: A certificate, or the CA's file (tls.ca: a bundle of several), as PEM text.
PEM = 1024 * 1024


@attrs.frozen
class WeightsAnswer:
    """``llmgw.cp.weights`` (``ctl weights``): what llmgw fetched that no model wants, per node.

    ``collected`` is None when nobody was asked to remove anything, and then
    says per node asked what it removed and what it refused.
    """

    unwanted: dict[str, list[WeightsFile]] = attrs.Factory(dict)
    collected: dict[str, CollectResult] | None = None


@attrs.frozen
class CordonAnswer:
    """``llmgw.cp.cordon`` and ``uncordon``: the node, now cordoned or not (ctl, the dashboard and the admin page)."""

    node: str = field(chars=IDENT)
    cordoned: bool


@attrs.frozen
class DrainAnswer:
    """``llmgw.cp.drain``: the node, cordoned, and the shards it was asked to stop, which are placed elsewhere.

    ``stopped`` is None when the server did not say (never the case so far),
    and an empty list when the node ran none.
    """

    node: str = field(chars=IDENT)
    cordoned: bool
    stopped: list[str] | None = field(None, chars=IDENT, items=NODE_SHARDS)


@attrs.frozen
class ReloadAnswer:
    """``llmgw.cp.reload`` (``ctl reload``): each change the reload applied, in words; a refusal is the call's error."""

    changes: list[str] = field(factory=list, chars=PROSE, items=RELOAD_CHANGES, text=Text.PROSE)


@attrs.frozen
class LogsAnswer:
    """``llmgw.cp.logs`` (``ctl logs``, the dashboard's and the admin page's log): a node's last lines, as it sent them.

    The control plane checks a node's answer against this before it relays
    it: a line longer than ``PROSE`` characters is cut, more than
    ``LOG_LINES`` lines keep the last ones, and a source that is not a
    name refuses the whole answer, naming the node.
    """

    node: str = field(chars=IDENT)
    source: str = field(chars=IDENT)
    sources: list[str] = field(factory=list, chars=IDENT, items=LOG_SOURCES)
    lines: list[str] = field(factory=list, chars=PROSE, items=LOG_LINES, text=Text.PROSE)


# -- onboarding (llmgw.control.identity; ctl onboard and offboard) --


@attrs.frozen
class Onboarding:
    """``llmgw.cp.onboarding``: what a node onboarded now is to have (this server's llmgw, the CA), and whether it signs."""

    version: str = field(chars=NAME)
    # False: the server keeps no CA (no pki.ca_dir); onboarding signs with --ca-dir instead.
    signs: bool
    # The CA certificate(s) the hub trusts (tls.ca), written to the node as its ca.crt.
    ca: str = field(chars=PEM, text=Text.FREE)


@attrs.frozen
class SignableNode:
    """``llmgw.cp.sign_node`` with ``check``: the name may be a node's, and nothing was signed.

    ``held`` is the serial (hex) of the certificate the CA holds for it now,
    None when it holds none.
    """

    node: str = field(chars=IDENT)
    held: str | None = field(None, chars=NAME)


@attrs.frozen
class SignedNode:
    """``llmgw.cp.sign_node``: the node's certificate, signed, with the CA's, as PEM; its serial in hex, its end in ISO 8601."""

    certificate: str = field(chars=PEM, text=Text.FREE)
    ca: str = field(chars=PEM, text=Text.FREE)
    serial: str = field(chars=NAME)
    not_after: str = field(chars=NAME)


@attrs.frozen
class RevocableNode:
    """``llmgw.cp.revoke_node`` with ``check``: the CA holds the node's certificate, this serial (hex), and would revoke it."""

    node: str = field(chars=IDENT)
    serial: str = field(chars=NAME)


@attrs.frozen
class RevokedNode:
    """``llmgw.cp.revoke_node``: the node's certificate is revoked (``already``: it was before), and what the hub did.

    ``hub`` is the hub's sentence when it read its list again, None when it
    did not say.
    """

    node: str = field(chars=IDENT)
    serial: str = field(chars=NAME)
    already: bool
    hub: str | None = field(None, chars=PROSE, text=Text.PROSE)


@attrs.frozen
class ScaleAnswer:
    """``llmgw.cp.scale``: a model's count as it stands after the command."""

    model: str = field(chars=IDENT)
    min: int = field(least=0, most=1_000_000)
    max: int = field(least=0, most=1_000_000)
    # The count the control plane wants now, and whether an operator pinned it (``ctl scale MODEL N``).
    target: int = field(least=0, most=1_000_000)
    pinned: bool = False
    ready: int = field(0, least=0, most=1_000_000)
    # What happens next, in words ("starting qwen/1", "draining qwen/2", "pinned until the next reload").
    words: str = field("", chars=PROSE, text=Text.PROSE)
