"""A third-party WAMP client against the hub: autobahn's asyncio flavour, in its own process.

Run as ``python asyncio_peer.py URL CA CERT KEY``.  It joins as the node of
its certificate, exercises what an agent does (calls, a timeout, a cancel,
refused publications and subscriptions), registers a procedure for the
test to call and cancel, then prints one JSON line of what it saw.  Lines
``READY`` and ``INVOKED`` tell the test where it is.  It shares no code with
llmgw: what it sees is what any conformant client would.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys

from autobahn.asyncio.wamp import ApplicationRunner, ApplicationSession
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, PublishOptions

AGENT = "llmgw.cp.agent."


def outcome(error: BaseException) -> str:
    if isinstance(error, ApplicationError):
        return error.error
    return type(error).__name__


class Peer(ApplicationSession):
    async def onJoin(self, details):
        seen = {"session": details.session, "authid": details.authid, "authrole": details.authrole}
        seen["whoami"] = await self.call(AGENT + "whoami")
        try:
            await self.call(AGENT + "never", options=CallOptions(timeout=100))
        except Exception as e:
            seen["timeout"] = outcome(e)
        pending = asyncio.ensure_future(self.call(AGENT + "never"))
        await self.call(AGENT + "whoami")  # the call has reached the hub before the cancel
        pending.cancel()
        try:
            await pending
        except BaseException as e:
            seen["cancel"] = outcome(e)
        self.publish("llmgw.event.node", "forged")  # unacknowledged: the hub says nothing
        try:
            await self.publish("llmgw.event.node", "forged", options=PublishOptions(acknowledge=True))
        except Exception as e:
            seen["publish_acknowledged"] = outcome(e)
        try:
            await self.subscribe(lambda *a: None, "llmgw.event.node")
        except Exception as e:
            seen["subscribe"] = outcome(e)
        seen["after_refusals"] = (await self.call(AGENT + "whoami"))["authid"]

        interrupted = asyncio.get_running_loop().create_future()

        async def hang():
            print("INVOKED", flush=True)
            try:
                await asyncio.get_running_loop().create_future()
            except asyncio.CancelledError:
                interrupted.set_result(True)
                raise

        await self.register(hang, f"llmgw.node.{details.authid}.hang")
        print("READY", flush=True)
        seen["interrupted"] = await asyncio.wait_for(interrupted, 10)
        seen["after_interrupt"] = (await self.call(AGENT + "whoami"))["authid"]
        print(json.dumps(seen), flush=True)
        self.leave()

    def onDisconnect(self):
        asyncio.get_event_loop().stop()


def main(url: str, ca: str, cert: str, key: str) -> None:
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    ApplicationRunner(url, "llmgw", ssl=context).run(Peer)


if __name__ == "__main__":
    main(*sys.argv[1:5])
