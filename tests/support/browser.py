"""A real headless Chromium for tests, driven over the DevTools protocol through a pipe (stdlib only).

``--remote-debugging-pipe`` makes Chromium read protocol commands from file descriptor 3 and
write answers and events to descriptor 4, each message JSON ended by a NUL byte: no port, no
websocket, no driver binary. :func:`find_chromium` looks for Debian's ``chromium`` (or the
browser named by ``RAG_TEST_CHROMIUM``); the tests skip with that reason where there is none.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

#: What the browser tests run (``RAG_TEST_CHROMIUM`` names another).
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--no-default-browser-check", "--mute-audio")


def find_chromium() -> str | None:
    """The browser to test with, or None."""
    named = os.environ.get("RAG_TEST_CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class BrowserError(Exception):
    """The browser answered a command with an error, or a page's script threw."""


class Browser:
    """One headless Chromium process with a fresh profile in ``profile``; :meth:`page` opens a tab."""

    def __init__(self, binary: str, profile: Path, *, timeout: float = 60, flags: tuple[str, ...] = ()):
        self.timeout = timeout
        self.log_path = Path(profile).with_suffix(".log")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def fds_3_and_4() -> None:  # in the child, before exec: the pipe ends where Chromium expects them
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([binary, *FLAGS, *flags, "--remote-debugging-pipe", f"--user-data-dir={profile}",
                                      "--window-size=1100,900", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     pass_fds=(3, 4), preexec_fn=fds_3_and_4)
        os.close(cmd_r)
        os.close(out_w)
        self._ids = iter(range(1, 1 << 62))
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._answers: dict[int, dict] = {}
        self.events: list[dict] = []
        self._closed = False
        threading.Thread(target=self._read, name="chromium-pipe", daemon=True).start()
        self.version = self.send("Browser.getVersion")["product"]

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = os.read(self._out_r, 1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._cv:
                    self._closed = True
                    self._cv.notify_all()
                return
            buf += data
            *messages, buf = buf.split(b"\0")
            with self._cv:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._answers[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cv.notify_all()

    def send(self, method: str, session: str | None = None, **params) -> dict:
        """The result of one protocol command (``session``: a tab's)."""
        with self._lock:
            mid = next(self._ids)
            msg = {"id": mid, "method": method, "params": params}
            if session:
                msg["sessionId"] = session
            os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while mid not in self._answers:
                if self._closed:
                    raise BrowserError(f"the browser exited; its output: {self.output()}")
                if not self._cv.wait(deadline - time.monotonic()) and time.monotonic() > deadline:
                    raise BrowserError(f"{method}: no answer in {self.timeout} s")
            answer = self._answers.pop(mid)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def page(self, *, width: int = 1100, height: int = 900) -> "Page":
        """A new tab (at about:blank), its viewport ``width`` x ``height``."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        return page

    def targets(self) -> list[dict]:
        """The browser's tabs and frames: ``type``, ``url``, ``targetId``..."""
        return self.send("Target.getTargets")["targetInfos"]

    def wait_tab(self, test, *, timeout: float = 60) -> "Page":
        """The first tab whose URL passes ``test`` (a tab a page opened), attached."""
        deadline = time.monotonic() + timeout
        while True:
            found = [t for t in self.targets() if t["type"] == "page" and test(t["url"])]
            if found:
                target = found[0]["targetId"]
                session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
                page = Page(self, target, session)
                page.send("Runtime.enable")
                return page
            if time.monotonic() > deadline:
                raise AssertionError(f"no tab opened in {timeout} s: {[t['url'] for t in self.targets()]}")
            time.sleep(0.1)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("Browser.close")
        except BrowserError:
            pass
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()


class Page:
    """One tab: navigate, run script, type and click as a person would, take screenshots."""

    def __init__(self, browser: Browser, target: str, session: str):
        self.browser, self.target, self.session = browser, target, session

    def send(self, method: str, **params) -> dict:
        return self.browser.send(method, self.session, **params)

    def goto(self, url: str, *, timeout: float = 60) -> None:
        """Open ``url`` and wait until its document has loaded."""
        answer = self.send("Page.navigate", url=url)
        if answer.get("errorText"):
            raise BrowserError(f"cannot open {url}: {answer['errorText']}")
        self.wait_for("document.readyState === 'complete'", timeout=timeout)

    def eval(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 120):
        """The first truthy value of ``expression``, polled until ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.eval(expression)
            except BrowserError:  # the page is between documents
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression!r} still false after {timeout} s; page text: "
                                     f"{self.text('body')[:2000]!r}")
            time.sleep(0.1)

    def text(self, selector: str) -> str:
        """The rendered text of the first element ``selector`` matches ('' when none does)."""
        return self.eval(f"(e => e ? e.innerText : '')(document.querySelector({json.dumps(selector)}))") or ""

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element."""
        box = self.eval(f"""(e => {{ if (!e) return null; e.scrollIntoView({{block: 'center'}});
                              const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2];
                            }})(document.querySelector({json.dumps(selector)}))""")
        if box is None:
            raise BrowserError(f"nothing matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        """Focus the element and type ``text`` into it, replacing what it held."""
        self.eval(f"(e => {{ e.focus(); e.select && e.select(); }})(document.querySelector({json.dumps(selector)}))")
        self.send("Input.insertText", text=text)

    def press(self, key: str = "Enter") -> None:
        codes = {"Enter": (13, "\r")}
        code, text = codes[key]
        self.send("Input.dispatchKeyEvent", type="keyDown", key=key, code=key, windowsVirtualKeyCode=code, text=text)
        self.send("Input.dispatchKeyEvent", type="keyUp", key=key, code=key, windowsVirtualKeyCode=code)

    def set_files(self, selector: str, paths: list[Path]) -> None:
        """Choose ``paths`` in the file input ``selector``, as a person picking files would (its change event fires)."""
        root = self.send("DOM.getDocument", depth=0)["root"]["nodeId"]
        node = self.send("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        if not node:
            raise BrowserError(f"nothing matches {selector!r}")
        self.send("DOM.setFileInputFiles", files=[str(p) for p in paths], nodeId=node)

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        """The colour of the viewport's pixel at (x, y), from a screenshot."""
        png = base64.b64decode(self.send("Page.captureScreenshot", format="png",
                                         clip={"x": x, "y": y, "width": 1, "height": 1, "scale": 1})["data"])
        return png_pixel(png)

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """A PNG of the page (all of it with ``full_page``)."""
        params = {"format": "png"}
        if full_page:
            height = self.eval("Math.ceil(document.documentElement.scrollHeight)")
            width = self.eval("Math.ceil(document.documentElement.clientWidth)")
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": width, "height": height,
                                                             "scale": 1})
        Path(path).write_bytes(base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]))
        return Path(path)

    def messages(self) -> list[str]:
        """What the browser logged about this tab: console messages, uncaught errors, CSP violations."""
        out = []
        for event in list(self.browser.events):
            if event.get("sessionId") != self.session:
                continue
            params = event.get("params", {})
            if event["method"] == "Log.entryAdded":
                entry = params["entry"]
                out.append(f"{entry['level']} {entry.get('source')}: {entry['text']}")
            elif event["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                out.append("exception: " + (details.get("exception", {}).get("description") or details["text"]))
            elif event["method"] == "Runtime.consoleAPICalled":
                out.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                    for a in params["args"]))
        return out

    def close(self) -> None:
        self.browser.send("Target.closeTarget", targetId=self.target)


def png_pixel(png: bytes, x: int = 0, y: int = 0) -> tuple[int, int, int]:
    """The RGB colour at (x, y) of an 8-bit RGB or RGBA PNG, non-interlaced (what Chromium writes)."""
    import struct
    import zlib

    pos, chunks, header = 8, [], None
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            chunks.append(data)
        pos += 12 + length
    width, height, depth, colour = header[:4]
    if depth != 8 or colour not in (2, 6):
        raise ValueError(f"an 8-bit RGB(A) PNG was expected, not depth {depth} colour type {colour}")
    bpp = 3 if colour == 2 else 4
    raw, stride, prev = zlib.decompress(b"".join(chunks)), width * bpp, bytearray(width * bpp)
    for row in range(y + 1):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
    return tuple(prev[x * bpp:x * bpp + 3])
