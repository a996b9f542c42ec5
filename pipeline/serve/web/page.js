// The page served at / by `rag serve`: a question box over POST /v1/chat/completions (streaming).
// Everything shown is inserted as text (textContent), never as HTML. The token, when the server
// asks for one, is kept in sessionStorage and sent as an Authorization header, never in a URL.
'use strict';

(() => {
  const TOKEN_KEY = 'rag-serve-token';
  const MAX_LISTED = 200;  // documents listed under "Documents"; the rest are counted
  const $ = (id) => document.getElementById(id);

  const state = {
    history: [],      // completed turns sent with a follow-up: [{role, content}]
    busy: false,
    retry: null,      // what to do once a token is given
    formats: {},      // source -> format, from GET /status
    sources: [],      // the current answer's sources
  };

  class NeedToken extends Error {}

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function withToken(headers) {
    const out = Object.assign({}, headers);
    const t = token();
    if (t) out.Authorization = 'Bearer ' + t;
    return out;
  }

  async function call(path, options = {}) {
    const resp = await fetch(path, Object.assign({}, options, {
      headers: withToken(options.headers), cache: 'no-store', credentials: 'omit',
    }));
    if (resp.status === 401) throw new NeedToken();
    return resp;
  }

  async function failure(resp) {
    try {
      const body = await resp.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return `${resp.status} ${resp.statusText}`;
  }

  function el(tag, text, attrs = {}) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  }

  function showError(message) {
    const box = $('error');
    box.textContent = message || '';
    box.hidden = !message;
  }

  // -- the token -------------------------------------------------------------------------------

  function askForToken(retry) {
    const hadOne = token() !== null;
    sessionStorage.removeItem(TOKEN_KEY);
    state.retry = retry;
    const note = $('token-note');
    note.textContent = hadOne ? 'The server refused that token.' : '';
    note.hidden = !hadOne;
    $('token-form').hidden = false;
    $('token').value = '';
    $('token').focus();
  }

  function tokenGiven(event) {
    event.preventDefault();
    const value = $('token').value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $('token-form').hidden = true;
    $('token').value = '';
    const retry = state.retry;
    state.retry = null;
    if (retry) retry();
  }

  // -- documents -------------------------------------------------------------------------------

  function documentUrl(source, page) {
    return 'documents?source=' + encodeURIComponent(source) + (page ? '#page=' + page : '');
  }

  function fileName(source) {
    const parts = String(source).split(/[\\/]/);
    return parts[parts.length - 1] || String(source);
  }

  function documentLink(source, text, page) {
    const a = el('a', text, {href: documentUrl(source, page), target: '_blank', rel: 'noopener noreferrer',
                             title: source});
    a.addEventListener('click', openDocument);
    return a;
  }

  // Without a token a link opens the document itself. With one the document is fetched with the
  // token as a header and opened from memory (a blob: URL), as PDF or as plain text only.
  async function openDocument(event) {
    if (token() === null) return;
    event.preventDefault();
    const link = event.currentTarget;
    const url = new URL(link.href);
    const hash = url.hash;
    url.hash = '';
    const win = window.open('', '_blank');
    if (win) win.opener = null;
    try {
      const resp = await call(url.href);
      if (!resp.ok) throw new Error(await failure(resp));
      const given = resp.headers.get('content-type') || '';
      const kind = given.startsWith('application/pdf') ? 'application/pdf'
        : (given.includes('charset=utf-8') ? 'text/plain; charset=utf-8' : 'text/plain');
      const blob = URL.createObjectURL(new Blob([await resp.arrayBuffer()], {type: kind}));
      if (win) win.location.href = blob + hash;
      setTimeout(() => URL.revokeObjectURL(blob), 60000);
    } catch (err) {
      if (win) win.close();
      if (err instanceof NeedToken) askForToken(() => link.click());
      else showError('Cannot open ' + fileName(link.title) + ': ' + err.message);
    }
  }

  async function loadCollection() {
    let resp;
    try {
      resp = await call('status');
    } catch (err) {
      if (err instanceof NeedToken) { askForToken(start); return false; }
      showError('Cannot reach the server: ' + err.message);
      return false;
    }
    if (!resp.ok) { showError(await failure(resp)); return false; }
    const st = await resp.json();
    const n = (x) => Number(x || 0).toLocaleString('en');
    $('collection').textContent = st.exists
      ? `Collection “${st.collection}”: ${n(st.documents)} documents, ${n(st.chunks)} chunks`
      : `Collection “${st.collection}” is empty: ingest documents first (rag ingest PATH)`;
    $('collection').dataset.documents = String(st.documents || 0);
    $('collection').dataset.chunks = String(st.chunks || 0);
    const list = $('documents');
    list.replaceChildren();
    const sources = st.sources || [];
    for (const doc of sources) state.formats[doc.source] = doc.format;
    for (const doc of sources.slice(0, MAX_LISTED)) {
      const li = el('li');
      li.append(documentLink(doc.source, fileName(doc.source)));
      if (doc.title) li.append(' ', el('span', doc.title, {class: 'title'}));
      const facts = [];
      if (doc.pages) facts.push(`${n(doc.pages)} pages`);
      facts.push(`${n(doc.chunks)} chunks`);
      li.append(' ', el('span', facts.join(', '), {class: 'facts'}));
      list.append(li);
    }
    if (sources.length > MAX_LISTED) list.append(el('li', `and ${n(sources.length - MAX_LISTED)} more`));
    $('library-summary').textContent = `Documents (${n(sources.length)})`;
    return true;
  }

  // -- asking ----------------------------------------------------------------------------------

  function moveTurnToConversation() {
    const turn = $('turn');
    if (turn.hidden || turn.dataset.state !== 'done') return;  // a failed turn is not part of the conversation
    const old = el('article', null, {class: 'earlier'});
    const sources = el('ol', null, {class: 'sources'});
    renderSources(sources, state.sources);
    old.append(el('h3', $('asked').textContent), el('div', $('answer').textContent, {class: 'answer'}),
               el('p', $('stats').textContent, {class: 'stats'}), sources);
    $('conversation').append(old);
  }

  function renderSources(list, sources) {
    list.replaceChildren();
    for (const s of sources || []) {
      const li = el('li', null, {value: String(s.n)});
      const pages = (s.pages || []).filter((p) => Number.isInteger(p) && p > 0);
      const pdf = state.formats[s.source] === 'pdf' || /\.pdf(\.gz)?$/i.test(s.source);
      li.append(documentLink(s.source, fileName(s.source)));
      if (pdf && pages.length) {
        li.append(' — ');
        pages.forEach((p, i) => {
          if (i) li.append(', ');
          li.append(documentLink(s.source, 'p. ' + p, p));
        });
      } else if (pages.length) {
        li.append(` — pages ${pages.join(', ')}`);
      }
      list.append(li);
    }
  }

  function renderStats(stats, firstTextSeconds) {
    const box = $('stats');
    const fmt = (s) => (s === null || s === undefined) ? '?' : Number(s).toFixed(2) + ' s';
    const n = (x) => Number(x || 0).toLocaleString('en');
    const parts = [
      `TTFT ${fmt(stats.ttft_seconds)}`,
      `reused ${n(stats.cached_tokens)} / ${n(stats.prompt_tokens)} prompt tokens`,
      `cache: ${stats.cache || 'none'}`,
    ];
    if (firstTextSeconds !== null) parts.push(`first text here after ${fmt(firstTextSeconds)}`);
    box.textContent = parts.join(' · ');
    Object.assign(box.dataset, {
      ttft: String(stats.ttft_seconds), reused: String(stats.cached_tokens || 0),
      prompt: String(stats.prompt_tokens || 0), cache: String(stats.cache || 'none'),
    });
  }

  // The server-sent events of one streamed answer, parsed: calls onChunk for each JSON object.
  async function readEvents(resp, onChunk) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const {value, done} = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), {stream: !done});
      const events = buffer.split(/\r?\n\r?\n/);
      buffer = events.pop();
      for (const event of events) {
        const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (!data) continue;
        if (data === '[DONE]') return;
        onChunk(JSON.parse(data));
      }
      if (done) return;
    }
  }

  async function ask(question) {
    question = question.trim();
    if (!question || state.busy) return;
    state.busy = true;
    $('ask').disabled = true;
    showError('');
    moveTurnToConversation();
    const turn = $('turn');
    turn.hidden = false;
    turn.dataset.state = 'asking';
    $('asked').textContent = question;
    const answer = $('answer');
    answer.textContent = '';
    $('sources').replaceChildren();
    state.sources = [];
    $('stats').textContent = 'Waiting for the first token…';
    for (const k of Object.keys($('stats').dataset)) delete $('stats').dataset[k];
    const messages = state.history.concat([{role: 'user', content: question}]);
    const started = performance.now();
    let firstText = null;
    let failed = null;
    try {
      const resp = await call('v1/chat/completions', {
        method: 'POST', headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({messages, stream: true}),
      });
      if (!resp.ok) throw new Error(await failure(resp));
      await readEvents(resp, (chunk) => {
        if (chunk.error) { failed = chunk.error.message || 'the answer failed'; return; }
        if (chunk.sources) {
          state.sources = chunk.sources;
          renderSources($('sources'), chunk.sources);
        }
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          if (firstText === null) {
            firstText = (performance.now() - started) / 1000;
            $('stats').textContent = `First text here after ${firstText.toFixed(2)} s; answering…`;
          }
          answer.append(document.createTextNode(delta.content));
        }
        if (chunk.stats) renderStats(chunk.stats, firstText);
      });
    } catch (err) {
      if (err instanceof NeedToken) {
        turn.hidden = true;
        state.busy = false;
        $('ask').disabled = false;
        askForToken(() => ask(question));
        return;
      }
      failed = err.message;
    }
    state.busy = false;
    $('ask').disabled = false;
    if (failed) {
      turn.dataset.state = 'failed';
      $('stats').textContent = '';
      showError(failed);
      return;
    }
    turn.dataset.state = 'done';
    if (!state.history.length) history.replaceState(null, '', '?q=' + encodeURIComponent(question));
    state.history.push({role: 'user', content: question}, {role: 'assistant', content: answer.textContent});
    $('question').value = '';
    $('question-label').textContent = 'Follow-up question';
  }

  function newConversation() {
    if (state.busy) return;
    state.history = [];
    $('conversation').replaceChildren();
    $('turn').hidden = true;
    $('answer').textContent = '';
    $('sources').replaceChildren();
    $('stats').textContent = '';
    $('question-label').textContent = 'Question';
    showError('');
    history.replaceState(null, '', location.pathname);
    $('question').focus();
  }

  // -- start -----------------------------------------------------------------------------------

  let asked = false;

  async function start() {
    if (!(await loadCollection())) return;
    const q = new URLSearchParams(location.search).get('q');
    if (q && !asked) {
      asked = true;
      $('question').value = q;
      ask(q);
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('token-form').addEventListener('submit', tokenGiven);
    $('ask-form').addEventListener('submit', (event) => { event.preventDefault(); ask($('question').value); });
    $('question').addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        ask($('question').value);
      }
    });
    $('new').addEventListener('click', newConversation);
    start();
  });
})();
