"""An engine build's life on its node: states, inputs and the table between them, and nothing else.

The states are the wire's, ``llmgw.states.EngineState``, as ``EngineInfo``
reports them; *absent* is the control plane's word for a build nobody
names, and a build this node holds is never absent.  A build the plan names
and the node has not got begins installing; an attempt at it moves on step
by step and ends refused, broken.  An attempt that proves the build runs
does not move the attempt's record: a record of the build as installed,
begun installed like one found on disk with its marker, takes its place.
Every build installed is checked again now and then; the check moves it
between installed and broken, through installing while it installs the OS
packages a library needs.  An input a state does not list is ignored and
leaves the state alone.

Carrying a transition out (the reason, the report, what to do next) is
``llmgw.agent.engines.install``'s.  A plain table, as a shard's
(``llmgw.agent.lifecycle``): what the installer does depends on the state a
build is in, not on the edge it took, and a test can walk a dict pair by pair.
"""

from __future__ import annotations

import enum

from llmgw.states import EngineState


class BuildInput(enum.Enum):
    """What can happen to an engine build on its node."""

    ATTEMPT = "attempt"  # an install of it begins
    STEP = "step"  # the install moves on: downloading, checking a sha256, unpacking, probing
    REFUSED = "refused"  # the install failed, or what it installed does not run here
    REPAIR = "repair"  # the OS packages that hold the libraries it lacks are being installed
    RUNS = "runs"  # checked again: it runs
    FAILS = "fails"  # checked again: it does not run


#: The states a build can begin in: wanted and not here yet, or installed (proven by its install, or found on disk).
BEGINNINGS = frozenset({EngineState.INSTALLING, EngineState.INSTALLED})


class BuildLifecycle:
    def __init__(self, initial: EngineState = EngineState.INSTALLING):
        if initial not in BEGINNINGS:
            raise ValueError(f"a build cannot begin {initial}; it begins {', '.join(sorted(BEGINNINGS))}")
        self.state = initial

    def fire(self, event: BuildInput) -> EngineState | None:
        """The state *event* leads to, now current; None when this state ignores it."""
        target = _TABLE.get((self.state, event))
        if target is not None:
            self.state = target
        return target


_S, _I = EngineState, BuildInput
_TABLE: dict[tuple[EngineState, BuildInput], EngineState] = {
    (_S.INSTALLING, _I.ATTEMPT): _S.INSTALLING,
    (_S.INSTALLING, _I.STEP): _S.INSTALLING,
    (_S.INSTALLING, _I.REPAIR): _S.INSTALLING,
    (_S.INSTALLING, _I.REFUSED): _S.BROKEN,
    # Tried again: the plan asks again, or a recheck finds it never got as
    # far as its folder (the mirror or the node may be mended since).
    (_S.BROKEN, _I.ATTEMPT): _S.INSTALLING,
    # A check that passes again says so in the reason (a CPU build's note).
    (_S.INSTALLED, _I.RUNS): _S.INSTALLED,
    # An unrelated upgrade can take a library away, and put it back.
    (_S.INSTALLED, _I.FAILS): _S.BROKEN,
    (_S.BROKEN, _I.RUNS): _S.INSTALLED,
    # Still broken; the reason may be another now.
    (_S.BROKEN, _I.FAILS): _S.BROKEN,
    # A check that finds a library gone installs its OS packages when the
    # plan allows them (now allows them, for one broken): installing again
    # meanwhile, and the check's answer after it says which it is now.
    (_S.INSTALLED, _I.REPAIR): _S.INSTALLING,
    (_S.BROKEN, _I.REPAIR): _S.INSTALLING,
    (_S.INSTALLING, _I.RUNS): _S.INSTALLED,
    (_S.INSTALLING, _I.FAILS): _S.BROKEN,
    # A python: build is probed where it is, by a recheck and by an attempt
    # alike; a recheck that began before the attempt may answer while the
    # attempt runs, and the attempt, answering last, has the last word.
    (_S.INSTALLED, _I.REFUSED): _S.BROKEN,
    (_S.BROKEN, _I.REFUSED): _S.BROKEN,
}
