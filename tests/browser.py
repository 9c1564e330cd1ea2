"""Headless Chromium driven over the DevTools protocol: load pages, read them after their scripts ran,
and collect every console error (uncaught exceptions, ``console.error``, failed loads).

A page's scripts run only in a browser: a page can look right in its HTML and still be broken for
every user (a script cut short, a library that never loaded). ``--dump-dom`` shows neither.

    with Chromium(tmp_path / "profile") as browser:
        browser.load("http://127.0.0.1:5555/tasks")
        browser.wait_for("document.querySelector('#tasks-table tbody').innerText.includes('square(7)')")
        assert not browser.errors
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path


def chromium_executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(AssertionError):
    """The browser did not do what the test asked within its deadline."""


class Chromium:
    """One headless Chromium with one tab, in a session of its own, stopped by its process group on close."""

    def __init__(self, profile: Path, *, window: tuple[int, int] = (1280, 900), timeout: float = 60):
        exe = chromium_executable()
        if exe is None:
            raise BrowserError("no chromium on PATH (apt-get install -y chromium)")
        self.profile = Path(profile)
        self.profile.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.errors: list[str] = []
        self.prompts = 0  # login prompts answered (answer_login_prompts)
        self._prompt_login = ""
        self._events: list[dict] = []
        self._next_id = 0
        (self.profile / "DevToolsActivePort").unlink(missing_ok=True)  # a stale one names a dead browser
        self._log = open(self.profile / "chromium.log", "wb")
        self._proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
             "--remote-debugging-port=0", "--remote-allow-origins=*", f"--window-size={window[0]},{window[1]}",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self._loop = asyncio.new_event_loop()
        try:
            self._ws = self._loop.run_until_complete(self._connect())
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    # --- protocol ----------------------------------------------------------------------------------

    async def _connect(self):
        from tornado.websocket import websocket_connect

        # Chromium writes its DevTools port into the profile once it listens (port 0: it picks one).
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise BrowserError(f"chromium never opened its DevTools port:\n{self.log_tail()}")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        while True:  # the page target appears a moment after the port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            if pages:
                break
            if time.monotonic() > deadline:
                raise BrowserError(f"chromium opened no tab:\n{self.log_tail()}")
            await asyncio.sleep(0.1)
        return await websocket_connect(pages[0]["webSocketDebuggerUrl"], max_message_size=64 << 20)

    def _note(self, event: dict) -> None:
        method, p = event.get("method"), event.get("params", {})
        if method in ("Fetch.requestPaused", "Fetch.authRequired"):
            self._answer_fetch(method, p)
        if method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            text = (d.get("exception") or {}).get("description") or d.get("text", "")
            self.errors.append(f"{text} ({d.get('url', '')}:{d.get('lineNumber', '')})")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            self.errors.append(f"console.{p['type']}: {args}")
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            e = p["entry"]
            self.errors.append(f"{e.get('text', '')} {e.get('url', '')}".strip())
        self._events.append(event)

    async def _receive(self, deadline: float) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrowserError("chromium sent nothing in time")
        try:
            raw = await asyncio.wait_for(self._ws.read_message(), left)
        except asyncio.TimeoutError:
            raise BrowserError("chromium sent nothing in time") from None
        if raw is None:
            raise BrowserError(f"chromium closed the DevTools connection:\n{self.log_tail()}")
        return json.loads(raw)

    async def _call(self, method: str, params: dict) -> dict:
        self._next_id += 1
        me = self._next_id
        await self._ws.write_message(json.dumps({"id": me, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while True:
            msg = await self._receive(deadline)
            if msg.get("id") == me:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._note(msg)

    def call(self, method: str, **params) -> dict:
        """One DevTools command; the events that arrive meanwhile are noted."""
        return self._loop.run_until_complete(self._call(method, params))

    async def _wait_event(self, method: str, deadline: float) -> dict:
        while True:
            msg = await self._receive(deadline)
            if "method" in msg:
                self._note(msg)
                if msg["method"] == method:
                    return msg

    # --- what a test does ------------------------------------------------------------------------

    def load(self, url: str) -> None:
        """Open ``url`` and wait for its load event (every script and stylesheet fetched and run)."""
        self._events.clear()
        result = self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"could not open {url}: {result['errorText']}")
        try:
            self._loop.run_until_complete(self._wait_event("Page.loadEventFired", time.monotonic() + self.timeout))
        except BrowserError as err:
            raise BrowserError(f"{url} never finished loading: {err}") from err

    def authorize(self, login: str) -> None:
        """Send HTTP basic auth ``login`` (``user:password``) with every request of this tab, as a browser
        does once its user typed the login."""
        self.call("Network.enable")
        self.call("Network.setExtraHTTPHeaders",
                  headers={"Authorization": "Basic " + base64.b64encode(login.encode()).decode()})

    def answer_login_prompts(self, login: str) -> None:
        """Type ``login`` (``user:password``) into every login prompt of this tab, as its user would: the page
        itself is opened without it, the server asks, the browser asks its user (Fetch.authRequired)."""
        self._prompt_login = login
        self.call("Fetch.enable", handleAuthRequests=True, patterns=[{"urlPattern": "*"}])

    def _answer_fetch(self, method: str, p: dict) -> None:
        """A request paused by ``answer_login_prompts``: go on with it; a login asked for: give it."""
        self._next_id += 1
        if method == "Fetch.requestPaused":
            msg = {"method": "Fetch.continueRequest", "params": {"requestId": p["requestId"]}}
        else:
            user, _, password = self._prompt_login.partition(":")
            self.prompts += 1
            msg = {"method": "Fetch.continueWithAuth",
                   "params": {"requestId": p["requestId"], "authChallengeResponse": {
                       "response": "ProvideCredentials", "username": user, "password": password}}}
        self._ws.write_message(json.dumps({"id": self._next_id, **msg}))  # its answer is read and dropped

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            d = result["exceptionDetails"]
            raise BrowserError(f"{expression!r} threw {(d.get('exception') or {}).get('description', d.get('text'))}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, what: str = "") -> object:
        """Poll ``expression`` until it is truthy; the page's text goes into the failure."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText : ''") or ""
                raise BrowserError(f"{what or expression} never held; console errors: {self.errors}; "
                                   f"page text:\n{text[-2000:]}")
            self._loop.run_until_complete(asyncio.sleep(0.2))

    def screenshot(self, path: Path) -> None:
        Path(path).write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.profile / "chromium.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
            self._ws = None
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)  # chromium and every helper it forked
        except ProcessLookupError:
            pass
        self._proc.wait()
        self._log.close()
        if not self._loop.is_closed():
            self._loop.run_until_complete(asyncio.sleep(0))  # let the closed socket's callbacks run
            self._loop.close()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# The rows of Flower's Tasks table, as text (DataTables fills it from /tasks/datatable after the page loads).
TASKS_ROWS = "Array.from(document.querySelectorAll('#tasks-table tbody tr')).map(r => r.textContent).join('\\n')"


def done_task_row(browser: Chromium, url: str, job_id: str) -> str | None:
    """Load Flower's Tasks page at ``url`` and return the row of ``job_id`` once it says SUCCESS, else None (task
    events reach Flower asynchronously: call again, e.g. under ``wait_until``)."""
    browser.load(url + "tasks")
    rows = browser.wait_for(f"(() => {{ const t = {TASKS_ROWS}; return t.includes('No tasks') || "
                            f"t.includes({json.dumps(job_id)}) ? t : ''; }})()", timeout=30,
                            what="the Tasks table filled in")
    return next((r for r in rows.splitlines() if job_id in r and "SUCCESS" in r), None)
