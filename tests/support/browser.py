"""Debian's chromium, headless, driven through its DevTools protocol over a WebSocket (autobahn, Twisted's).

No webdriver and no browser download: chromium starts with
``--remote-debugging-port=0`` and a temporary profile, writes the port it
chose to ``DevToolsActivePort`` there, and this module speaks CDP to it —
one page target, attached with a flat session.  For pytest-twisted tests::

    browser = await Browser.start(chromium, tmp_path)
    try:
        await browser.goto(url)
        await browser.click("a[href^='/node']")
        await browser.until("document.querySelector('pre').textContent.includes('hello')", "the line")
        await browser.screenshot(path, 390, 844)
    finally:
        await browser.close()

Every wait has a deadline and says what it waited for.  Uncaught script
errors and console errors (a Content-Security-Policy refusal is one) are
collected in ``problems`` for the test to assert on.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, endpoints, reactor

from tests.support.wait import NeverHappened, until, until_awaited

START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0


class BrowserError(AssertionError):
    """Chromium answered a command with an error, or did not answer."""


class _CDP(WebSocketClientProtocol):
    def onOpen(self):
        self.factory.opened.callback(self)

    def onMessage(self, payload, isBinary):
        self.factory.browser._received(json.loads(payload))

    def onClose(self, wasClean, code, reason):
        self.factory.browser._closed(reason)


class Browser:
    def __init__(self, proc: subprocess.Popen, profile: Path):
        self.proc = proc
        self.profile = profile
        self.problems: list[str] = []
        self._ws: _CDP | None = None
        self._next = 0
        self._waiting: dict[int, defer.Deferred] = {}
        self._session: str | None = None

    @classmethod
    async def start(cls, chromium: str, base: Path) -> Browser:
        profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=base))
        argv = [chromium, "--headless", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--hide-scrollbars", "--mute-audio",
                "about:blank"]
        if os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")  # chromium refuses to sandbox as root
        log = open(profile / "chromium.log", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        browser = cls(proc, profile)
        try:
            port, path = await browser._active_port()
            factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}{path}")
            factory.protocol = _CDP
            factory.browser = browser
            factory.opened = defer.Deferred()
            factory.setProtocolOptions(maxMessagePayloadSize=0, maxFramePayloadSize=0)
            endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=10)
            await endpoint.connect(factory)
            browser._ws = await _within(factory.opened, START_TIMEOUT_S, "chromium's DevTools WebSocket to open")
            target = await browser.call("Target.createTarget", url="about:blank", session=False)
            attached = await browser.call("Target.attachToTarget", targetId=target["targetId"], flatten=True,
                                          session=False)
            browser._session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                await browser.call(f"{domain}.enable")
        except BaseException:
            await browser.close()
            raise
        return browser

    async def _active_port(self) -> tuple[int, str]:
        marker = self.profile / "DevToolsActivePort"
        def written() -> bool:
            return marker.exists() and len(marker.read_text().splitlines()) >= 2

        await until(lambda: written() or self.proc.poll() is not None, "chromium to write DevToolsActivePort",
                    START_TIMEOUT_S, 0.05, self.output)
        if not written():
            raise BrowserError(f"chromium exited ({self.proc.returncode}):\n{self.output()}")
        port, path = marker.read_text().splitlines()[:2]
        return int(port), path

    def output(self) -> str:
        log = self.profile / "chromium.log"
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""

    # -- the protocol --

    async def call(self, method: str, session: bool = True, **params):
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if session and self._session is not None:
            message["sessionId"] = self._session
        answer = defer.Deferred()
        self._waiting[self._next] = answer
        self._ws.sendMessage(json.dumps(message).encode())
        reply = await _within(answer, CALL_TIMEOUT_S, f"chromium to answer {method}")
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')} ({reply['error']})")
        return reply.get("result", {})

    def _received(self, message: dict) -> None:
        waiting = self._waiting.pop(message.get("id"), None)
        if waiting is not None:
            waiting.callback(message)
            return
        method, params = message.get("method"), message.get("params") or {}
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            self.problems.append("script error: " + str((details.get("exception") or {}).get("description")
                                                        or details.get("text")))
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            entry = params["entry"]
            self.problems.append(f"console: {entry.get('text')} ({entry.get('url', '')})")
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.problems.append("console.error: " + " ".join(str(a.get("value")) for a in params.get("args") or []))

    def _closed(self, reason) -> None:
        waiting, self._waiting = self._waiting, {}
        for answer in waiting.values():
            answer.errback(BrowserError(f"chromium's DevTools connection closed ({reason})"))

    # -- what a test does --

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result.get("result", {}).get("value")

    async def until(self, expression: str, what: str, timeout: float = 30.0):
        """Poll *expression* in the page until it is truthy; the page's text is in the failure."""
        async def value():
            try:
                return await self.evaluate(expression)
            except BrowserError:  # between two documents there is nothing to evaluate in
                return None

        try:
            return await until_awaited(value, what, timeout, 0.1)
        except NeverHappened as e:
            text = await self.evaluate("document.location.href + '\\n' + (document.body ? document.body.innerText : '')")
            raise NeverHappened(f"{e}\npage: {str(text)[:3000]}") from None

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.loaded(url)

    async def loaded(self, url_part: str = "", timeout: float = 30.0) -> None:
        await self.until(f"document.readyState === 'complete' && location.href.includes({json.dumps(url_part)})",
                         f"the page {url_part or ''} to load", timeout)

    async def click(self, selector: str) -> None:
        """A real mouse click in the middle of the first element *selector* matches, scrolled into view."""
        box = await self.until(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return r.width ? {x: r.x + r.width / 2, y: r.y + r.height / 2} : null; })()",
            f"{selector} to be on the page")
        for kind in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1)

    async def text(self, selector: str = "body") -> str:
        return await self.evaluate(f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText || ''")

    async def viewport(self, width: int, height: int) -> None:
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                        mobile=width < 600)

    async def screenshot(self, path: Path, width: int, height: int, full: bool = False) -> Path:
        """The page at *width*×*height* as a PNG at *path*; with *full*, all of it at that width."""
        await self.viewport(width, height)
        await self.until("document.readyState === 'complete'", "the page to settle at the new size")
        options = {}
        if full:
            size = (await self.call("Page.getLayoutMetrics"))["cssContentSize"]
            options = {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": width, "height": max(height, size["height"]), "scale": 1}}
        shot = await self.call("Page.captureScreenshot", format="png", **options)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    async def close(self) -> None:
        if self._ws is not None:
            try:
                await _within(self.call("Browser.close", session=False), 5, "chromium to close")
            except Exception:
                pass  # it is killed below either way
            self._ws.dropConnection(abort=True)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            await until(lambda: self.proc.poll() is not None, "chromium to exit, killed", 15, 0.05, self.output)
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


async def _within(waitable, timeout: float, what: str):
    d = defer.ensureDeferred(waitable) if not isinstance(waitable, defer.Deferred) else waitable
    d.addTimeout(timeout, reactor)
    try:
        return await d
    except defer.TimeoutError:
        raise BrowserError(f"timed out after {timeout:g} s waiting for {what}") from None
