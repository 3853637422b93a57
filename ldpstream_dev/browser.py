"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for tests and screenshots.

:class:`HeadlessChromium` launches the browser with a fresh profile, no sandbox (it runs as root in CI), no
GPU and none of its background network traffic, on a DevTools port it picks itself (read back from the
profile's ``DevToolsActivePort``), and talks to one page over a WebSocket (aiohttp's client, already a
dependency). It can open a URL, evaluate JavaScript, wait for a condition, collect the page's uncaught errors
and save a full-page PNG screenshot. The binary comes from :func:`ldpstream_dev.debian.ensure_binary`.
"""
from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .debian import ensure_binary
from .processes import log_tail, stop_child

__all__ = ["HeadlessChromium", "chromium_binary"]

_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
          "--disable-sync", "--disable-extensions", "--disable-default-apps", "--metrics-recording-only",
          "--mute-audio", "--hide-scrollbars", "--remote-allow-origins=*")


def chromium_binary() -> str:
    """``chromium`` (Debian package ``chromium``, installed if missing)."""
    return ensure_binary("chromium", "chromium")


class HeadlessChromium:
    """One headless Chromium process and one page of it (use as a context manager).

    ``open(url)`` navigates and waits for the load event; ``evaluate(js)`` returns the value of an
    expression (awaiting promises); ``wait_for(js, timeout)`` polls an expression until it is truthy;
    ``errors`` lists the page's uncaught exceptions and console errors; ``screenshot(path)`` saves the whole
    page as PNG.
    """

    def __init__(self, width: int = 1440, height: int = 900, run_dir: Path | None = None) -> None:
        self.width, self.height = width, height
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="ldp-chromium-"))
        self.profile = self.run_dir / "profile"
        self.log_path = self.run_dir / "chromium.log"
        self.errors: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._loop = asyncio.new_event_loop()
        self._session: Any = None
        self._ws: Any = None
        self._next_id = 0

    # ------------------------------------------------------------------ process
    def start(self, timeout: float = 60.0) -> "HeadlessChromium":
        shutil.rmtree(self.profile, ignore_errors=True)
        self.profile.mkdir(parents=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [chromium_binary(), *_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "--remote-debugging-address=127.0.0.1", f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium did not open its DevTools port in {timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self._run(self._connect(port, deadline))
        return self

    def stop(self) -> None:
        if self._session is not None:
            self._run(self._session.close())
            self._session = None
        if self.proc is not None:
            stop_child(self.proc, 10)
        if not self._loop.is_closed():
            self._loop.close()

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> "HeadlessChromium":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ page
    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate to ``url`` and wait until ``document.readyState`` is ``complete``."""
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'", timeout,
                      what=f"loading {url}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited; JSON-serializable results)."""
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression!r} threw: {reply['exceptionDetails'].get('exception', reply)}")
        return reply["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str = "condition", poll: float = 0.25) -> Any:
        """Poll ``expression`` until it is truthy; returns its value, else raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {expression!r} still {value!r} after {timeout} s; page errors: "
                                   f"{self.errors[-5:]}")
            time.sleep(poll)

    def screenshot(self, path: Path) -> Path:
        """Save the whole page (not only the viewport) as a PNG at ``path``."""
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=max(height, 100),
                  deviceScaleFactor=1, mobile=False)
        try:
            data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        finally:
            self.call("Emulation.clearDeviceMetricsOverride")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    # ------------------------------------------------------------------ protocol
    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events received meanwhile are recorded)."""
        return self._run(asyncio.wait_for(self._call(method, params), timeout))

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    async def _connect(self, port: int, deadline: float) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()
        while True:
            try:
                async with self._session.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in await r.json(content_type=None) if t.get("type") == "page"]
                if pages:
                    break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("chromium has no page target")
            await asyncio.sleep(0.1)
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=256 << 20)
        for domain in ("Page.enable", "Runtime.enable"):
            await self._call(domain, {})

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads((await self._ws.receive()).data)
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._record(msg)

    def _record(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append(str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
