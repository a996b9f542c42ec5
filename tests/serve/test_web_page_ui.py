"""The web page's own features in a real headless Chromium, against a real `rag serve` with the bundled
models: Stop (the engine free for the next question at once), answers as safe Markdown, copy, dark mode,
the question box, conversations kept across a reload, the collection picker, documents added from the
page (and refused), sources numbered as `rag ask` numbers them, and a text source opened at its passage.

One server for the module (with a token, a second collection, an --allow folder and a small upload
limit), one browser; each test opens its own tab. Skipped where no Chromium is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from support.browser import Browser, find_chromium
from support.pdfs import make_pdf
from support.serving import RagServer, serve_env
from test_web_page import INERT_NAME, INERT_TEXT, TOKEN, _ask, _give_token, _wait_answered

QUOKKA = "# Quokkas\n\nQuokkas live on Rottnest Island, near Perth in Western Australia.\n"
NUMBERED = "Which fruit is rich in potassium?"
MAX_UPLOAD = 64 << 10
EVIL_ANSWER = ("# Heading\n\nSome **bold** and *italic* text with `code`, a [link](https://example.org), "
               "a [bad link](javascript:window.__pwned=1) and a citation [1].\n\n- one\n- two\n\n"
               "```\n<script>window.__pwned = 2</script>\n```\n\n"
               "<script>window.__pwned = 3</script> <img src=x onerror=\"window.__pwned = 4\"> "
               "![pic](https://example.org/x.png)\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory, model_home):
    from conftest import CORPUS

    root = tmp_path_factory.mktemp("web-ui")
    docs, zoo, allowed, outside = (root / n for n in ("docs", "zoo", "allowed", "outside"))
    for d in (docs, zoo, allowed, outside):
        d.mkdir()
    (docs / "guide.md").write_text(CORPUS["guide.md"])
    (docs / "notes.txt").write_text(CORPUS["notes.txt"])
    (docs / INERT_NAME).write_text(INERT_TEXT)
    make_pdf(docs / "manual.pdf", ["Page one is about KV state and prefix caches.",
                                   "Page two explains that bananas are yellow and rich in potassium."],
             title="Manual")
    (zoo / "quokka.md").write_text(QUOKKA)
    env = serve_env(root, model_home, RAG_SERVE_TOKEN=TOKEN, RAG_CACHE_MIN_TOKENS="64")
    for folder, extra in ((docs, ()), (zoo, ("--collection", "zoo"))):
        subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(folder), *extra], env=env, check=True,
                       capture_output=True, timeout=600)
    cli = subprocess.run([sys.executable, "-m", "pipeline", "ask", "--json", NUMBERED], env=env, check=True,
                         capture_output=True, text=True, timeout=600)
    server = RagServer(env, "--allow", str(allowed), "--max-upload", str(MAX_UPLOAD), log=root / "serve.log").start()
    yield {"server": server, "base": server.base, "docs": docs.resolve(), "allowed": allowed.resolve(),
           "outside": outside.resolve(), "root": root, "cli": json.loads(cli.stdout)}
    server.stop()


def _open(browser, site):
    page = browser.page()
    page.goto(site["base"] + "/")
    if page.wait_for("!document.getElementById('token-form').hidden || "
                     "document.getElementById('collection').dataset.documents"):
        if not page.eval("document.getElementById('collection').dataset.documents"):
            _give_token(page, TOKEN)
    page.wait_for("document.getElementById('collection').dataset.documents")
    return page


@pytest.fixture
def tab(site, browser):
    page = _open(browser, site)
    yield page
    page.close()


def _trouble(page) -> list[str]:
    return [m for m in page.messages() if "Content Security Policy" in m or m.startswith("exception")]


def _chat_requests(site) -> int:
    return sum(" POST /v1/chat/completions " in line for line in site["server"].output().splitlines())


def test_stop_cancels_the_answer_and_frees_the_engine_for_the_next_question(site, tab):
    # Long answers while window.__long is set: the page's requests are sent with max_tokens 400.
    tab.eval("""window.__long = true; const real = window.fetch; window.fetch = (url, opts) => {
                  if (window.__long && opts && opts.body && String(url).includes('chat/completions')) {
                    const body = JSON.parse(opts.body); body.max_tokens = 400; opts.body = JSON.stringify(body); }
                  return real(url, opts); };""")
    question = "Describe every document in great detail, one paragraph each."
    tab.type("#question", question)
    tab.click("#ask")
    tab.wait_for("document.getElementById('answer').innerText.length > 15", timeout=300)
    assert tab.eval("document.activeElement.id") == "question"  # emptied and focused once asked
    assert tab.eval("document.getElementById('question').value") == ""
    assert not tab.eval("document.getElementById('stop').hidden") and tab.eval("document.getElementById('ask').hidden")
    server = site["server"]
    before = _chat_requests(site)
    stopped_at = time.monotonic()
    tab.click("#stop")
    tab.wait_for("document.getElementById('turn').dataset.state === 'stopped'", timeout=30)
    partial = tab.text("#answer")
    assert partial and "Stopped after" in tab.text("#stats")
    while _chat_requests(site) == before:  # the server ends that request (its access-log line) once cancelled
        assert time.monotonic() - stopped_at < 30, server.output()[-2000:]
        time.sleep(0.05)
    time.sleep(max(0.0, 1.0 - (time.monotonic() - stopped_at)))  # a second after Stop the engine is idle:
    cpu = server.cpu_seconds()
    time.sleep(2)
    busy = server.cpu_seconds() - cpu  # the stopped answer had hundreds of tokens left, seconds of decoding
    assert busy < 0.5, f"the server used {busy:.1f} CPU-s in the 2 s from a second after Stop"
    tab.eval("window.__long = false")
    _ask(tab, question)  # the next question is answered, the documents' prefix kept from the stopped one
    assert int(tab.eval("document.getElementById('stats').dataset.reused")) > 0
    assert partial in tab.text("#conversation")  # the stopped turn stays in the conversation
    assert not _trouble(tab), tab.messages()


def test_answers_are_rendered_as_markdown_and_html_in_them_stays_inert(site, browser, tab):
    fragment = tab.eval(f"""(() => {{
        const box = document.createElement('div'); box.id = 'md-test';
        box.append(RagMarkdown.render({json.dumps(EVIL_ANSWER)}, {{cite: (n) => {{
            const a = document.createElement('a'); a.href = '#s' + n; a.textContent = String(n); return a; }} }}));
        document.body.append(box);
        const q = (s) => box.querySelectorAll(s).length;
        return {{h: q('h3'), strong: q('strong'), em: q('em'), code: q('code'), pre: q('pre'), li: q('ul li'),
                 links: [...box.querySelectorAll('a')].map(a => a.getAttribute('href')), cite: q('.cite a'),
                 script: q('script'), img: q('img'), text: box.innerText}};
    }})()""")
    assert fragment["h"] == 1 and fragment["strong"] == 1 and fragment["em"] == 1 and fragment["li"] == 2
    assert fragment["pre"] == 1 and fragment["code"] == 2 and fragment["cite"] == 1
    assert fragment["links"] == ["https://example.org", "#s1"]  # javascript: is not a link; images are not loaded
    assert fragment["script"] == 0 and fragment["img"] == 0
    assert "<script>window.__pwned = 3</script>" in fragment["text"]
    assert 'onerror="window.__pwned = 4"' in fragment["text"]
    assert "[bad link](javascript:window.__pwned=1)" in fragment["text"] and "pic" in fragment["text"]

    # The same answer kept in the browser's history and shown from there, as a person reopens it.
    stored = {"id": "evil0000", "collection": "default", "title": "An answer holding markup", "updated": 2e12,
              "turns": [{"question": "<b>Q?</b>", "answer": EVIL_ANSWER, "state": "done", "stats": None,
                         "sources": [{"n": 1, "source": str(site["docs"] / INERT_NAME), "pages": [],
                                      "excerpt": "Okapis live in the rainforests of the Congo; they are related"}]}]}
    tab.eval(f"localStorage.setItem('rag-conversations', JSON.stringify([{json.dumps(stored)}]))")
    tab.goto(site["base"] + "/")
    tab.wait_for("!!document.querySelector('#conversations a[data-id=\"evil0000\"]')")
    tab.click('#conversations a[data-id="evil0000"]')
    tab.wait_for("!!document.querySelector('#conversation .earlier strong')")
    assert tab.eval("document.querySelectorAll('main script, main img, #conversation b').length") == 0
    assert "<b>Q?</b>" in tab.text("#conversation h3")
    tab.click("#conversation .cite a")  # the citation opens its source, a document holding <img onerror>: as text
    tab.wait_for("document.getElementById('viewer').open && document.getElementById('viewer-text').innerText.length")
    assert '<img src=x onerror="window.__pwned = 6">' in tab.text("#viewer-text")
    assert tab.eval("document.querySelectorAll('dialog img, dialog script').length") == 0
    tab.wait_for("!!document.getElementById('viewer-mark')")  # the passage used, highlighted
    assert tab.eval("typeof window.__pwned") == "undefined"
    assert not _trouble(tab), tab.messages()


def test_copy_gives_the_answer_as_written(site, tab):
    _ask(tab, "What does the flag --n-cpu-moe keep in CPU memory?")
    tab.eval("window.__copied = null; navigator.clipboard.writeText = (t) => { window.__copied = t; "
             "return Promise.resolve(); };")
    tab.click("#copy")
    tab.wait_for("window.__copied !== null")
    assert tab.eval("window.__copied") == tab.eval("document.getElementById('answer').dataset.markdown")
    assert tab.eval("window.__copied").strip() and tab.text("#copy") == "Copied"


def test_dark_mode_follows_the_browsers_preference(site, browser, tmp_path):
    light = _open(browser, site)
    try:
        assert sum(light.pixel(3, 3)) > 600  # the light page's wash
    finally:
        light.close()
    dark_browser = Browser(find_chromium(), tmp_path / "dark-profile", flags=("--force-dark-mode",))
    try:
        dark = _open(dark_browser, site)
        assert dark.eval("matchMedia('(prefers-color-scheme: dark)').matches")
        assert sum(dark.pixel(3, 3)) < 150, dark.pixel(3, 3)  # a dark wash, from a real screenshot
        ink = dark.eval("getComputedStyle(document.querySelector('h1')).color")
        assert ink != "rgb(29, 35, 43)", ink  # light text on it
    finally:
        dark_browser.close()


def test_conversations_are_kept_across_a_reload_and_listed_to_return_to(site, browser, tab):
    question = "Where do okapis live?"
    _ask(tab, question)
    answer = tab.text("#answer")
    tab.goto(site["base"] + "/")  # a reload: the conversation comes back
    tab.wait_for(f"document.getElementById('conversation').innerText.includes({json.dumps(question)})")
    assert answer in tab.text("#conversation")
    assert question in tab.text("#conversations")
    other = _open(browser, site)  # another tab: listed, and opened from the list
    try:
        link = other.eval(f"""[...document.querySelectorAll('#conversations a')]
                              .find(a => a.textContent === {json.dumps(question)}).dataset.id""")
        other.click(f'#conversations a[data-id="{link}"]')
        other.wait_for(f"document.getElementById('conversation').innerText.includes({json.dumps(answer)})")
        _ask(other, "And what are they related to?")  # a follow-up continues it, with the earlier turn sent
        assert question in other.text("#conversation")
    finally:
        other.close()


def test_the_collection_picker_asks_another_collection(site, tab):
    options = tab.eval("[...document.querySelectorAll('#collection-picker option')].map(o => o.value)")
    assert options == ["default", "zoo"]
    tab.eval("window.__bodies = []; const real = window.fetch; window.fetch = (u, o) => { "
             "if (o && o.body) window.__bodies.push(JSON.parse(o.body)); return real(u, o); };")
    tab.eval("const p = document.getElementById('collection-picker'); p.value = 'zoo'; "
             "p.dispatchEvent(new Event('change'));")
    tab.wait_for("document.getElementById('collection').dataset.name === 'zoo'")
    assert "1 documents" in tab.text("#collection")
    assert "quokka.md" in tab.eval("document.getElementById('documents').textContent")
    _ask(tab, "Where do quokkas live?")
    assert [s.strip() for s in tab.text("#sources").splitlines()] == ["quokka.md"]
    assert tab.eval("window.__bodies[window.__bodies.length - 1].collection") == "zoo"


def test_documents_are_added_into_an_allowed_folder_and_refused_elsewhere(site, tab, tmp_path):
    tab.click("#library-summary")
    assert not tab.eval("document.getElementById('add').hidden")
    doc = tmp_path / "wombat.md"
    doc.write_text("# Wombats\n\nWombats leave cube-shaped droppings.\n")
    before = int(tab.eval("document.getElementById('collection').dataset.documents"))
    tab.set_files("#upload-files", [doc])
    tab.click("#upload")
    tab.wait_for("(li => li && ['done', 'failed', 'refused'].includes(li.dataset.state))"
                 "(document.querySelector('#uploads li[data-name=\"wombat.md\"]'))", timeout=300)
    assert tab.eval("document.querySelector('#uploads li[data-name=\"wombat.md\"]').dataset.state") == "done"
    assert (site["allowed"] / "wombat.md").read_text() == doc.read_text()
    tab.wait_for(f"Number(document.getElementById('collection').dataset.documents) === {before + 1}")
    assert "wombat.md" in tab.text("#documents")

    outside = tmp_path / "plan.md"
    outside.write_text("# A plan\n\nNothing to see.\n")
    elsewhere = json.dumps(str(site["outside"]))
    tab.eval(f"""const s = document.getElementById('upload-folder');
                 s.append(new Option('elsewhere', {elsewhere})); s.value = {elsewhere};""")
    big = tmp_path / "big.txt"
    big.write_text("x" * (MAX_UPLOAD + 1))
    tab.set_files("#upload-files", [outside, big])
    tab.click("#upload")
    tab.wait_for("document.querySelectorAll('#uploads li[data-state=\"refused\"]').length === 2", timeout=120)
    said = tab.text("#uploads")
    assert "folders this server was allowed" in said and "--allow" in said  # the server's refusal, as it said it
    assert "larger than 65,536 bytes" in said
    assert not list(site["outside"].iterdir()) and not (site["allowed"] / "big.txt").exists()


def test_sources_are_numbered_from_1_as_rag_ask_numbers_them(site, tab):
    _ask(tab, NUMBERED)
    shown = tab.eval("[...document.querySelectorAll('#sources li')].map(li => [li.value, "
                     "li.querySelector('a').title])")
    cli = [[s["n"], s["source"]] for s in site["cli"]["sources"]]
    assert shown == cli and [n for n, _ in shown] == list(range(1, len(shown) + 1)), (shown, cli)
    assert any(s.endswith("manual.pdf") for _, s in shown)


def test_a_text_source_opens_at_the_passage_used(site, tab):
    _ask(tab, "What does the flag --n-cpu-moe keep in CPU memory?")
    guide = str(site["docs"] / "guide.md")
    tab.click(f'#sources a.passage[title={json.dumps(guide)}]')
    tab.wait_for("document.getElementById('viewer').open && !!document.getElementById('viewer-mark')")
    marked = tab.text("#viewer-mark")
    text = (site["docs"] / "guide.md").read_text()
    assert marked and " ".join(marked.split()) in " ".join(text.split())
    assert "highlighted" in tab.text("#viewer-note")
    tab.click("#viewer-close")
    assert not tab.eval("document.getElementById('viewer').open")
