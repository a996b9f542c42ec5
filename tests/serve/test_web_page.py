"""The web page at `/` in a real headless Chromium, against a real `rag serve` with the bundled models.

One server for the module (with a token, as a server off loopback has), one browser; each
test opens its own tab. The browser tests skip where no Chromium is installed (Debian's
`chromium` package; setup.sh installs it where apt-get can); the plain HTTP tests of the
documents route and of the page's headers run everywhere.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from support.pdfs import make_pdf
from support.serving import RagServer, serve_env

TOKEN = "web-page-token-5150"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "The vault code is 7431."
# A document whose title and file name are markup: the page must show them as text.
INERT_NAME = '<img src=x onerror="window.__pwned=4">.md'
INERT_TITLE = "<script>window.__pwned = 5</script> Okapi notes"
INERT_TEXT = (f"# {INERT_TITLE}\n\nOkapis live in the rainforests of the Congo; they are related to giraffes. "
              '<img src=x onerror="window.__pwned = 6"> <b>bold?</b>\n')
HTML_DOC = ("<html><head><title>&lt;script&gt;window.__pwned = 1&lt;/script&gt; Gardening</title></head><body>"
            "<h1>Tomatoes</h1><p>Tomato plants need full sun.</p><script>window.__pwned = 2</script></body></html>")


@pytest.fixture(scope="module")
def site(tmp_path_factory, model_home):
    from conftest import CORPUS

    root = tmp_path_factory.mktemp("web")
    docs, outside = root / "docs", root / "outside"
    docs.mkdir()
    outside.mkdir()
    (docs / "guide.md").write_text(CORPUS["guide.md"])
    (docs / "notes.txt").write_text(CORPUS["notes.txt"])
    (docs / "page.html").write_text(HTML_DOC)
    (docs / INERT_NAME).write_text(INERT_TEXT)
    (docs / "changing.txt").write_text("Capybaras are the largest rodents.\n")
    make_pdf(docs / "manual.pdf", ["Page one is about KV state and prefix caches.",
                                   "Page two explains that bananas are yellow and rich in potassium."],
             title="Manual")
    (outside / "secret.txt").write_text(SECRET + "\n")
    env = serve_env(root, model_home, RAG_SERVE_TOKEN=TOKEN, RAG_CACHE_MIN_TOKENS="64")
    subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(docs)], env=env, check=True,
                   capture_output=True, timeout=600)
    server = RagServer(env, log=root / "serve.log").start()
    yield {"server": server, "base": server.base, "docs": docs.resolve(), "outside": outside.resolve()}
    server.stop()


def _state(page) -> str:
    return page.eval("document.getElementById('turn').dataset.state || ''")


def _wait_answered(page, *, timeout: float = 300) -> None:
    page.wait_for("['done', 'failed'].includes(document.getElementById('turn').dataset.state)", timeout=timeout)
    assert _state(page) == "done", page.text("#error")


def _ask(page, question: str, *, enter: bool = False) -> None:
    page.type("#question", question)
    if enter:
        page.press("Enter")
    else:
        page.click("#ask")
    page.wait_for("document.getElementById('asked').textContent === " + json.dumps(question))
    _wait_answered(page)


def _give_token(page, token: str) -> None:
    page.wait_for("!document.getElementById('token-form').hidden")
    page.type("#token", token)
    page.click("#token-use")


@pytest.fixture
def tab(site, browser):
    """A tab on the page that has been given the token (through its form)."""
    page = browser.page()
    page.goto(site["base"] + "/")
    _give_token(page, TOKEN)
    page.wait_for("document.getElementById('collection').dataset.documents")
    yield page
    page.close()


def _url(source: str) -> str:
    return "/documents?source=" + quote(str(source), safe="")


def _csp_or_script_trouble(page) -> list[str]:
    return [m for m in page.messages() if "Content Security Policy" in m or m.startswith("exception")]


# -- in the browser ----------------------------------------------------------------------------------


def test_the_token_is_asked_once_and_sent_only_as_a_header(site, browser):
    page = browser.page()
    try:
        page.goto(site["base"] + "/")
        _give_token(page, "not-the-token")
        page.wait_for("!document.getElementById('token-note').hidden")  # refused: asked again, saying so
        assert "refused" in page.text("#token-note")
        assert not page.eval("document.getElementById('collection').dataset.documents")
        _give_token(page, TOKEN)
        documents = page.wait_for("document.getElementById('collection').dataset.documents")
        assert int(documents) == 6
        assert "6 documents" in page.text("#collection")
        assert page.eval("document.getElementById('token-form').hidden")
        assert page.eval("sessionStorage.getItem('rag-serve-token')") == TOKEN

        page.goto(site["base"] + "/")  # once: the tab keeps it
        page.wait_for("document.getElementById('collection').dataset.documents")
        assert page.eval("document.getElementById('token-form').hidden")
        urls = page.eval("[location.href, ...performance.getEntriesByType('resource').map(e => e.name)]")
        assert urls and not any(TOKEN in u for u in urls), urls
        assert not _csp_or_script_trouble(page), page.messages()
    finally:
        page.close()


def test_an_asked_question_fills_answer_sources_and_stats_and_a_follow_up_continues(site, tab):
    tab.eval("""window.__sent = []; const real = window.fetch;
                window.fetch = (url, opts) => { if (opts && opts.body) window.__sent.push(JSON.parse(opts.body));
                                                return real(url, opts); };""")
    question = "Which fruit is rich in potassium?"
    _ask(tab, question)
    assert tab.text("#answer").strip()
    assert "manual.pdf" in tab.text("#sources")
    stats = tab.eval("({...document.getElementById('stats').dataset})")
    assert "TTFT" in tab.text("#stats") and float(stats["ttft"]) > 0
    assert int(stats["prompt"]) > 0 and stats["cache"] in ("none", "memory", "disk", "composed", "miss")
    assert f"of {int(stats['prompt']):,} prompt tokens" in tab.text("#stats")
    assert tab.eval("new URLSearchParams(location.search).get('q')") == question  # a link to share

    _ask(tab, "And what colour are they?", enter=True)
    assert tab.text("#answer").strip()
    earlier = tab.text("#conversation")
    assert question in earlier and "TTFT" in earlier and "manual.pdf" in earlier  # the first turn stays shown
    sent = tab.eval("window.__sent")
    assert [m["role"] for m in sent[-1]["messages"]] == ["user", "assistant", "user"]
    assert sent[-1]["messages"][0]["content"] == question and sent[-1]["stream"] is True
    follow = tab.eval("({...document.getElementById('stats').dataset})")
    assert int(follow["reused"]) > 0, follow  # the documents' prefix was kept: the follow-up starts at once


def test_q_asks_on_load(site, tab):
    question = "What does the flag --n-cpu-moe keep in CPU memory?"
    tab.goto(site["base"] + "/?q=" + quote(question))
    _wait_answered(tab)
    assert tab.text("#asked") == question
    assert tab.text("#answer").strip()
    assert "guide.md" in tab.text("#sources")
    assert "TTFT" in tab.text("#stats")


def test_a_document_text_holding_script_is_shown_inert(site, browser, tab):
    tab.click("#library-summary")  # the list of documents opens
    listed = tab.text("#documents")
    assert INERT_TITLE in listed and INERT_NAME in listed  # shown as the text it is
    assert "<script>window.__pwned = 1</script> Gardening" in listed
    _ask(tab, "Where do okapis live?")
    assert INERT_NAME in tab.text("#sources")
    assert tab.eval("document.querySelectorAll('main script, main img, #documents b, #sources b').length") == 0
    assert tab.eval("typeof window.__pwned") == "undefined"
    assert not _csp_or_script_trouble(tab), tab.messages()

    link = f'#documents a[title={json.dumps(str(site["docs"] / "page.html"))}]'
    tab.click(link)  # the HTML document opens as plain text: its script is text, never run
    opened = browser.wait_tab(lambda url: url.startswith("blob:"))
    try:
        opened.wait_for("document.readyState === 'complete' && !!document.body")
        assert opened.eval("document.contentType") == "text/plain"
        assert "<script>window.__pwned = 2</script>" in opened.eval("document.body.innerText")
        assert opened.eval("typeof window.__pwned") == "undefined"
    finally:
        opened.close()


def test_a_source_link_opens_the_pdf_page_and_serves_only_collection_files(site, browser, tab):
    _ask(tab, "Which fruit is rich in potassium?")
    pdf = str(site["docs"] / "manual.pdf")
    hrefs = tab.eval("[...document.querySelectorAll('#sources a')].map(a => a.getAttribute('href'))")
    page_links = [h for h in hrefs if h.startswith(_url(pdf)[1:] + "#page=")]
    assert page_links, hrefs
    tab.click(f'#sources a[href={json.dumps(page_links[0])}]')
    page_number = page_links[0].rsplit("=", 1)[1]
    opened = browser.wait_tab(lambda url: url.startswith("blob:") and url.endswith("#page=" + page_number))
    try:
        opened.wait_for("document.readyState === 'complete'")
        assert opened.eval("document.contentType") == "application/pdf"  # the browser's viewer, at that page
    finally:
        opened.close()

    fetch = """(async (url, auth) => {
                  const r = await fetch(url, {headers: auth ? {Authorization: 'Bearer ' + sessionStorage.getItem(
                      'rag-serve-token')} : {}});
                  const body = new Uint8Array(await r.arrayBuffer());
                  const digest = await crypto.subtle.digest('SHA-256', body);
                  return [r.status, r.headers.get('content-type'),
                          [...new Uint8Array(digest)].map(b => b.toString(16).padStart(2, '0')).join('')];
               })(%s, %s)"""
    status, kind, digest = tab.eval(fetch % (json.dumps(page_links[0].split("#")[0]), "true"))
    assert (status, kind) == (200, "application/pdf")
    assert digest == hashlib.sha256((site["docs"] / "manual.pdf").read_bytes()).hexdigest()
    for other in (site["outside"] / "secret.txt", f"{site['docs']}/../outside/secret.txt", "/etc/passwd"):
        assert tab.eval(fetch % (json.dumps(_url(other)[1:]), "true"))[0] == 404, other
    assert tab.eval(fetch % (json.dumps(page_links[0].split("#")[0]), "false"))[0] == 401


# -- plain HTTP --------------------------------------------------------------------------------------


def _get(server, path: str, **headers):
    """(status, raw body, headers) of a GET with the token unless ``headers`` say otherwise."""
    import http.client

    headers = {"Host": f"127.0.0.1:{server.port}", **AUTH, **headers}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            if v is not None:
                conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def test_the_documents_route_serves_collection_files_as_pdf_or_plain_text(site):
    server, docs = site["server"], site["docs"]
    status, body, headers = _get(server, _url(docs / "manual.pdf"))
    assert status == 200 and body == (docs / "manual.pdf").read_bytes()
    assert headers["content-type"] == "application/pdf" and headers["x-content-type-options"] == "nosniff"
    status, body, headers = _get(server, _url(docs / "page.html"))
    assert status == 200 and body == HTML_DOC.encode()
    assert headers["content-type"] == "text/plain; charset=utf-8"  # never text/html on the server's origin
    assert "sandbox" in headers["content-security-policy"]
    assert _get(server, _url(docs / INERT_NAME))[1] == INERT_TEXT.encode()


def test_the_documents_route_refuses_everything_else(site):
    server, docs, outside = site["server"], site["docs"], site["outside"]
    not_found = {
        "outside the collection": _url(outside / "secret.txt"),
        "system file": _url("/etc/passwd"),
        "dot-dot": _url(f"{docs}/../outside/secret.txt"),
        "dot-dot inside": _url(f"{docs}/../docs/guide.md"),
        "relative": _url("guide.md"),
        "the folder": _url(docs),
        "a near miss": _url(f"{docs}/guide.md/"),
        "NUL": _url(f"{docs}/guide.md") + "%00",
        "bad escape": "/documents?source=%ff%fe",
        "a path in the route": "/documents/../etc/passwd",
        "a path under it": "/documents/etc/passwd",
    }
    got = {name: _get(server, path) for name, path in not_found.items()}
    assert {name: status for name, (status, _, _) in got.items()} == {name: 404 for name in not_found}
    lookups = {body for name, (_, body, _) in got.items() if "route" not in name and "under" not in name}
    assert len(lookups) == 1 and b"7431" not in next(iter(lookups))  # one answer: nothing to probe with

    bad = {
        "no source": ("/documents", {}),
        "two sources": (_url(docs / "guide.md") + "&source=x", {}),
        "too long": (_url("/" + "a" * 5000), {}),
        "no token": (_url(docs / "guide.md"), {"Authorization": None}),
        "wrong token": (_url(docs / "guide.md"), {"Authorization": "Bearer nope"}),
        "foreign host": (_url(docs / "guide.md"), {"Host": f"evil.example:{server.port}"}),
        "foreign origin": (_url(docs / "guide.md"), {"Origin": "http://evil.example"}),
    }
    statuses = {name: _get(server, path, **headers)[0] for name, (path, headers) in bad.items()}
    assert statuses == {"no source": 400, "two sources": 400, "too long": 400, "no token": 401,
                        "wrong token": 401, "foreign host": 403, "foreign origin": 403}
    assert server.request("POST", _url(docs / "guide.md"), json_body={}, headers=AUTH)[0] == 405


def test_a_file_changed_since_it_was_ingested_is_not_served(site):
    server, path = site["server"], site["docs"] / "changing.txt"
    original = path.read_text()
    assert _get(server, _url(path))[0] == 200
    path.write_text(original.replace("largest", "smallest"))  # the same size, other content
    try:
        status, body, _ = _get(server, _url(path))
        assert status == 404 and json.loads(body)["error"]["code"] == "document_changed"
    finally:
        path.write_text(original)
    assert _get(server, _url(path))[:2] == (200, original.encode())


def test_the_page_loads_without_the_token_and_weakens_no_other_guard(site):
    server = site["server"]
    for path in ("/", "/web/page.js", "/web/page.css"):
        status, body, headers = _get(server, path, Authorization=None)
        assert status == 200 and body, path
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "frame-ancestors 'none'" in csp and headers["x-content-type-options"] == "nosniff"
        assert _get(server, path, Authorization=None, Host=f"evil.example:{server.port}")[0] == 403
        assert _get(server, path, Authorization=None, Origin="http://evil.example")[0] == 403
    page = _get(server, "/")[1].decode()
    assert re.search(r"<script src=", page)
    assert not re.search(r"<script(?![^>]*\ssrc=)", page) and not re.search(r"\son\w+\s*=", page)  # nothing inline
    for path in ("/status", "/v1/models", "/web/other.js", "/web/", "/index.html", _url(site["docs"] / "guide.md")):
        assert _get(server, path, Authorization=None)[0] == 401, path
    assert server.request("POST", "/search", json_body={"query": "okapi"})[0] == 401
