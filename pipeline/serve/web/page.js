// The page served at / by `rag serve`: a question box over POST /v1/chat/completions (streaming), with
// Stop, answers rendered as Markdown (web/markdown.js: DOM nodes only, never HTML from the answer),
// copy, conversations kept in this browser (web/history.js), a collection picker (GET /collections),
// documents added from the page (PUT /upload) and a viewer that opens a text source at the passage used.
// The token, when the server asks for one, is kept in sessionStorage and sent as an Authorization
// header, never in a URL.
'use strict';

(() => {
  const TOKEN_KEY = 'rag-serve-token';
  const MAX_LISTED = 200;  // documents listed under "Documents"; the rest are counted
  const MAX_VIEWED = 4 << 20;  // characters of a document the viewer shows
  const $ = (id) => document.getElementById(id);
  const H = window.RagHistory;
  const n = (x) => Number(x || 0).toLocaleString('en');

  const state = {
    busy: false,
    controller: null,  // the AbortController of the answer being asked
    retry: null,       // what to do once a token is given
    formats: {},       // source -> format, from GET /status
    collection: null,  // the collection asked (null: the server's own, until GET /collections names it)
    defaultCollection: null,
    conversation: H.start(null),
    live: null,        // the turn being asked or last asked: {question, answer, sources, stats, state}
    uploads: {folders: [], max_bytes: 0},
  };

  class NeedToken extends Error {}

  // -- talking to the server ---------------------------------------------------------------------

  const token = () => sessionStorage.getItem(TOKEN_KEY);

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

  // A query string of `params`, with the collection asked when it is not the server's own.
  function query(params) {
    const all = Object.assign({}, params);
    if (state.collection && state.collection !== state.defaultCollection) all.collection = state.collection;
    return Object.entries(all).filter(([, v]) => v !== null && v !== undefined)
      .map(([k, v]) => k + '=' + encodeURIComponent(v)).join('&');
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

  // -- documents and the viewer ------------------------------------------------------------------

  function documentUrl(source, page) {
    return 'documents?' + query({source}) + (page ? '#page=' + page : '');
  }

  function fileName(source) {
    const parts = String(source).split(/[\\/]/);
    return parts[parts.length - 1] || String(source);
  }

  const isPdf = (source) => state.formats[source] === 'pdf' || /\.pdf(\.gz)?$/i.test(source);

  function documentLink(source, text, page) {
    const a = el('a', text, {href: documentUrl(source, page), target: '_blank', rel: 'noopener noreferrer',
                             title: source});
    a.addEventListener('click', openDocument);
    return a;
  }

  // A link to source `s` of an answer: a PDF opens at its page; any other document opens in the
  // viewer at the passage used.
  function sourceLink(s, text, page) {
    if (isPdf(s.source)) return documentLink(s.source, text, page || (s.pages || [])[0]);
    const a = el('a', text, {href: documentUrl(s.source), title: s.source, class: 'passage'});
    a.addEventListener('click', (event) => { event.preventDefault(); openViewer(s); });
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

  // Where the passage `excerpt` lies in `text` ([start, end]), its words matched whatever the spacing.
  function findPassage(text, excerpt) {
    const words = String(excerpt || '').split(/\s+/).filter(Boolean);
    const escape = (w) => w.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    for (const count of [words.length, 12, 6]) {
      if (!count || count > words.length) continue;
      const m = new RegExp(words.slice(0, count).map(escape).join('\\s+')).exec(text);
      if (!m) continue;
      if (count === words.length) return [m.index, m.index + m[0].length];
      const end = text.indexOf('\n\n', m.index + m[0].length);
      return [m.index, Math.min(end < 0 ? text.length : end, m.index + excerpt.length * 2)];
    }
    return null;
  }

  async function openViewer(s) {
    const dialog = $('viewer');
    $('viewer-title').textContent = fileName(s.source);
    $('viewer-note').textContent = 'Loading…';
    $('viewer-excerpt').hidden = true;
    $('viewer-text').replaceChildren();
    if (!dialog.open) dialog.showModal();
    let text;
    try {
      const resp = await call(documentUrl(s.source));
      if (!resp.ok) throw new Error(await failure(resp));
      text = await resp.text();
    } catch (err) {
      if (err instanceof NeedToken) { dialog.close(); askForToken(() => openViewer(s)); return; }
      $('viewer-note').textContent = 'Cannot open the document: ' + err.message;
      return;
    }
    const where = findPassage(text, s.excerpt);
    const pre = $('viewer-text');
    if (where) {
      const [a, b] = where;
      const from = Math.max(0, a - MAX_VIEWED / 2);
      const mark = el('mark', text.slice(a, b), {id: 'viewer-mark'});
      pre.append(text.slice(from, a), mark, text.slice(b, Math.max(b, from + MAX_VIEWED)));
      $('viewer-note').textContent = `${s.source} — the passage the answer used is highlighted.`;
      mark.scrollIntoView({block: 'center'});
    } else {
      pre.append(text.slice(0, MAX_VIEWED));
      $('viewer-note').textContent = s.excerpt
        ? `${s.source} — the passage the answer used (not found as such in the file, whose text was converted when it was added):`
        : s.source;
      if (s.excerpt) {
        $('viewer-excerpt').textContent = s.excerpt;
        $('viewer-excerpt').hidden = false;
      }
    }
  }

  // -- the collection ----------------------------------------------------------------------------

  async function loadCollections() {
    const resp = await call('collections');
    if (!resp.ok) throw new Error(await failure(resp));
    const listed = await resp.json();
    const picker = $('collection-picker');
    picker.replaceChildren();
    const names = listed.collections.map((c) => c.name);
    state.defaultCollection = listed.default;
    if (!state.collection || !names.includes(state.collection)) state.collection = listed.default;
    for (const c of listed.collections) {
      const option = el('option', `${c.name} (${n(c.documents)} documents)`, {value: c.name});
      if (c.name === state.collection) option.selected = true;
      picker.append(option);
    }
    picker.disabled = listed.collections.length < 2;
    state.uploads = listed.uploads || {folders: [], max_bytes: 0};
    renderUploadForm();
  }

  async function loadCollection() {
    const resp = await call('status?' + query({}));
    if (!resp.ok) throw new Error(await failure(resp));
    const st = await resp.json();
    $('collection').textContent = st.exists
      ? `Collection “${st.collection}”: ${n(st.documents)} documents, ${n(st.chunks)} chunks`
      : `Collection “${st.collection}” is empty: add documents below, or run rag ingest PATH`;
    Object.assign($('collection').dataset, {documents: String(st.documents || 0), chunks: String(st.chunks || 0),
                                            name: st.collection});
    const list = $('documents');
    list.replaceChildren();
    const sources = st.sources || [];
    state.formats = {};
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
  }

  async function switchCollection() {
    if (state.busy) return;
    state.collection = $('collection-picker').value;
    newConversation();
    try {
      await loadCollection();
    } catch (err) {
      if (err instanceof NeedToken) askForToken(switchCollection);
      else showError(err.message);
    }
  }

  // -- one turn: question, answer, figures, sources ----------------------------------------------

  const CACHE_WORDS = {
    composed: 'composed from saved section states', disk: 'restored from a saved prefix on disk',
    memory: 'kept in memory', server: 'kept by the generator server', miss: 'nothing reused yet (saved for next time)',
    none: 'no cache',
  };

  function statsLine(stats, firstTextSeconds) {
    const fmt = (s) => (s === null || s === undefined) ? '?' : Number(s).toFixed(2) + ' s';
    let how = CACHE_WORDS[stats.cache] || stats.cache || 'no cache';
    if (stats.cache === 'composed' && stats.composed_sections) {
      how = `composed from ${n(stats.composed_sections)} saved section states`
        + (stats.recomputed_tokens ? ` (${n(stats.recomputed_tokens)} tokens recomputed at their seams)` : '');
    }
    const parts = [`TTFT ${fmt(stats.ttft_seconds)}`,
                   `reused ${n(stats.cached_tokens)} of ${n(stats.prompt_tokens)} prompt tokens: ${how}`];
    if (firstTextSeconds !== null && firstTextSeconds !== undefined) parts.push(`first text here after ${fmt(firstTextSeconds)}`);
    return parts.join(' · ');
  }

  function renderStats(box, stats, firstTextSeconds) {
    box.textContent = statsLine(stats, firstTextSeconds);
    Object.assign(box.dataset, {
      ttft: String(stats.ttft_seconds), reused: String(stats.cached_tokens || 0),
      prompt: String(stats.prompt_tokens || 0), cache: String(stats.cache || 'none'),
    });
  }

  function renderSources(list, sources) {
    list.replaceChildren();
    for (const s of sources || []) {
      const li = el('li', null, {value: String(s.n)});
      const pages = (s.pages || []).filter((p) => Number.isInteger(p) && p > 0);
      li.append(sourceLink(s, fileName(s.source)));
      if (isPdf(s.source) && pages.length) {
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

  // The answer's Markdown into `box`, its citations [n] linked to the sources.
  function renderAnswer(box, text, sources) {
    const byNumber = new Map((sources || []).map((s) => [s.n, s]));
    const cite = (number, page) => {
      const s = byNumber.get(number);
      return s ? sourceLink(s, String(number), page) : null;
    };
    box.replaceChildren(RagMarkdown.render(text, {cite}));
    box.dataset.markdown = text;
  }

  function copyButton(getText) {
    const button = el('button', 'Copy', {type: 'button', class: 'small quiet copy'});
    button.addEventListener('click', () => copy(getText(), button));
    return button;
  }

  async function copy(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) {  // no clipboard API here (a page not on localhost or https): the old way
      const area = el('textarea');
      area.value = text;
      document.body.append(area);
      area.select();
      document.execCommand('copy');
      area.remove();
    }
    button.textContent = 'Copied';
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  }

  // An earlier (or stored) turn, as an article of the conversation.
  function renderEarlier(turn) {
    const old = el('article', null, {class: 'earlier turn'});
    const answer = el('div', null, {class: 'answer'});
    renderAnswer(answer, turn.answer, turn.sources);
    const stats = el('p', null, {class: 'stats'});
    if (turn.stats) renderStats(stats, turn.stats, null);
    if (turn.state === 'stopped') stats.textContent = 'Stopped.';
    const tools = el('div', null, {class: 'row tools'});
    tools.append(stats, copyButton(() => turn.answer));
    const sources = el('ol', null, {class: 'sources'});
    renderSources(sources, turn.sources);
    old.append(el('h3', turn.question), answer, tools, sources);
    $('conversation').append(old);
  }

  // -- asking ------------------------------------------------------------------------------------

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

  function setBusy(busy) {
    state.busy = busy;
    $('ask').hidden = busy;
    $('stop').hidden = !busy;
    $('asking').hidden = !busy;
    $('collection-picker').disabled = busy || $('collection-picker').options.length < 2;
  }

  function moveTurnToConversation() {
    const turn = $('turn');
    if (!turn.hidden && ['done', 'stopped'].includes(turn.dataset.state) && state.live) renderEarlier(state.live);
    turn.hidden = true;
  }

  async function ask(question) {
    question = question.trim();
    if (!question || state.busy) return;
    setBusy(true);
    showError('');
    moveTurnToConversation();
    $('question').value = '';
    $('question').focus();
    const turn = $('turn');
    turn.hidden = false;
    turn.dataset.state = 'asking';
    $('asked').textContent = question;
    const answerBox = $('answer');
    answerBox.replaceChildren();
    $('sources').replaceChildren();
    $('copy').hidden = true;
    const statsBox = $('stats');
    statsBox.textContent = 'Waiting for the first token…';
    for (const k of Object.keys(statsBox.dataset)) delete statsBox.dataset[k];
    const live = {question, answer: '', sources: [], stats: null, state: 'asking'};
    state.live = live;
    const messages = [];
    for (const t of state.conversation.turns) {
      if (t.state === 'done') messages.push({role: 'user', content: t.question}, {role: 'assistant', content: t.answer});
    }
    messages.push({role: 'user', content: question});
    const started = performance.now();
    let firstText = null;
    let failed = null;
    let drawn = false;
    const draw = () => {
      if (drawn) return;
      drawn = true;
      requestAnimationFrame(() => { drawn = false; renderAnswer(answerBox, live.answer, live.sources); });
    };
    state.controller = new AbortController();
    try {
      const resp = await call('v1/chat/completions', {
        method: 'POST', headers: {'Content-Type': 'application/json'}, signal: state.controller.signal,
        body: JSON.stringify({messages, stream: true, collection: state.collection}),
      });
      if (!resp.ok) throw new Error(await failure(resp));
      await readEvents(resp, (chunk) => {
        if (chunk.error) { failed = chunk.error.message || 'the answer failed'; return; }
        if (chunk.sources) {
          live.sources = chunk.sources;
          renderSources($('sources'), chunk.sources);
        }
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          if (firstText === null) {
            firstText = (performance.now() - started) / 1000;
            statsBox.textContent = `First text here after ${firstText.toFixed(2)} s; answering…`;
          }
          live.answer += delta.content;
          draw();
        }
        if (chunk.stats) { live.stats = chunk.stats; renderStats(statsBox, chunk.stats, firstText); }
      });
    } catch (err) {
      if (err instanceof NeedToken) {
        turn.hidden = true;
        setBusy(false);
        askForToken(() => ask(question));
        return;
      }
      if (err.name === 'AbortError') live.state = 'stopped';
      else failed = err.message;
    } finally {
      state.controller = null;
    }
    setBusy(false);
    renderAnswer(answerBox, live.answer, live.sources);
    if (failed) {
      turn.dataset.state = 'failed';
      statsBox.textContent = '';
      showError(failed);
      return;
    }
    if (live.state === 'stopped') {
      statsBox.textContent = `Stopped after ${((performance.now() - started) / 1000).toFixed(2)} s.`;
    } else {
      live.state = 'done';
    }
    turn.dataset.state = live.state;
    $('copy').hidden = false;
    if (!state.conversation.turns.length) history.replaceState(null, '', '?q=' + encodeURIComponent(question));
    state.conversation = H.add(state.conversation, live);
    H.setCurrent(state.conversation.id);
    renderConversations();
    $('question-label').textContent = 'Follow-up question';
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  // -- conversations -----------------------------------------------------------------------------

  function showConversation(conversation) {
    state.conversation = conversation;
    state.live = null;
    $('conversation').replaceChildren();
    $('turn').hidden = true;
    showError('');
    conversation.turns.forEach(renderEarlier);
    $('question-label').textContent = conversation.turns.length ? 'Follow-up question' : 'Question';
    renderConversations();
  }

  function newConversation() {
    if (state.busy) return;
    showConversation(H.start(state.collection));
    H.setCurrent(null);
    history.replaceState(null, '', location.pathname);
    $('question').focus();
  }

  async function openConversation(id) {
    const conversation = H.get(id);
    if (!conversation || state.busy) return;
    H.setCurrent(id);
    if (conversation.collection && conversation.collection !== state.collection
        && [...$('collection-picker').options].some((o) => o.value === conversation.collection)) {
      state.collection = conversation.collection;
      $('collection-picker').value = conversation.collection;
      try { await loadCollection(); } catch (err) { showError(err.message); }
    }
    showConversation(conversation);
    history.replaceState(null, '', location.pathname);
  }

  function renderConversations() {
    const list = $('conversations');
    list.replaceChildren();
    const all = H.list();
    for (const c of all) {
      const li = el('li', null, {class: c.id === (state.conversation && state.conversation.id) ? 'current' : ''});
      const a = el('a', c.title || 'Untitled', {href: '#', 'data-id': c.id});
      a.addEventListener('click', (event) => { event.preventDefault(); openConversation(c.id); });
      const when = new Date(c.updated).toLocaleString('en', {dateStyle: 'short', timeStyle: 'short'});
      li.append(a, el('span', `${c.collection || ''} · ${c.turns.length} · ${when}`, {class: 'facts'}));
      list.append(li);
    }
    $('no-conversations').hidden = all.length > 0;
    $('forget').hidden = all.length === 0;
  }

  function forgetAll() {
    if (state.busy || !confirm('Forget every conversation kept in this browser?')) return;
    H.clear();
    newConversation();
  }

  // -- adding documents --------------------------------------------------------------------------

  function renderUploadForm() {
    const folders = state.uploads.folders || [];
    $('add').hidden = folders.length === 0;
    $('add-off').hidden = folders.length > 0;
    const select = $('upload-folder');
    select.replaceChildren(...folders.map((f) => el('option', f, {value: f})));
    select.hidden = folders.length < 2;
    $('upload-limit').textContent = folders.length
      ? `Each file up to ${(state.uploads.max_bytes / 2 ** 20).toFixed(0)} MiB (.pdf, .md, .txt, .html); it is saved `
        + 'into the folder on the server, then added to the chosen collection.' : '';
  }

  function putFile(file, folder, progress) {
    return new Promise((resolve) => {
      const xhr = new XMLHttpRequest();
      xhr.open('PUT', 'upload?' + query({name: file.name, folder}));
      const t = token();
      if (t) xhr.setRequestHeader('Authorization', 'Bearer ' + t);
      xhr.upload.onprogress = (e) => { if (e.lengthComputable) progress(e.loaded / e.total); };
      xhr.onload = () => {
        let body = null;
        try { body = JSON.parse(xhr.responseText); } catch (e) { /* not JSON */ }
        resolve({status: xhr.status, body});
      };
      xhr.onerror = () => resolve({status: 0, body: {error: {message: 'the connection failed'}}});
      xhr.send(file);
    });
  }

  async function waitJob(id, say) {
    for (;;) {
      const resp = await call('ingest/' + encodeURIComponent(id));
      if (!resp.ok) throw new Error(await failure(resp));
      const job = await resp.json();
      if (job.state === 'done' || job.state === 'failed') return job;
      say(job.state === 'queued' ? 'waiting for the ingest before it…' : 'adding to the collection…');
      await new Promise((r) => setTimeout(r, 400));
    }
  }

  async function uploadFiles() {
    const files = [...$('upload-files').files];
    if (!files.length) return;
    const folder = $('upload-folder').value || null;
    for (const file of files) {
      const li = el('li', null, {'data-name': file.name});
      const bar = el('progress', null, {max: '1', value: '0'});
      const said = el('span', '', {class: 'facts'});
      const say = (text, kind) => { said.textContent = text; li.dataset.state = kind || 'running'; };
      li.append(el('span', file.name + ' '), bar, ' ', said);
      $('uploads').append(li);
      if (file.size > state.uploads.max_bytes) {
        say(`refused: larger than ${n(state.uploads.max_bytes)} bytes, the most this server takes`, 'refused');
        continue;
      }
      say('sending…');
      const sent = await putFile(file, folder, (share) => { bar.value = share; });
      if (sent.status === 401) { say('refused: the server needs its token', 'refused'); askForToken(uploadFiles); return; }
      if (sent.status !== 202) {
        say('refused: ' + ((sent.body && sent.body.error && sent.body.error.message) || `HTTP ${sent.status}`), 'refused');
        continue;
      }
      bar.value = 1;
      try {
        const job = await waitJob(sent.body.job.id, say);
        if (job.state === 'failed') say('not added: ' + job.error.message, 'failed');
        else if ((job.report.counts || {}).failed) say('not added: the file could not be read', 'failed');
        else say('added', 'done');
      } catch (err) {
        say('not added: ' + err.message, 'failed');
      }
    }
    $('upload-files').value = '';
    try { await loadCollections(); await loadCollection(); } catch (err) { showError(err.message); }
  }

  // -- start -------------------------------------------------------------------------------------

  async function start() {
    try {
      await loadCollections();
      await loadCollection();
    } catch (err) {
      if (err instanceof NeedToken) askForToken(start);
      else showError('Cannot reach the server: ' + err.message);
      return;
    }
    const q = new URLSearchParams(location.search).get('q');
    const current = H.current() && H.get(H.current());
    if (current && !q) {
      await openConversation(current.id);
    } else if (state.conversation.collection !== state.collection) {
      showConversation(H.start(state.collection));
    }
    if (q && !state.conversation.turns.length && !state.asked) {
      state.asked = true;
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
    $('stop').addEventListener('click', stop);
    $('new').addEventListener('click', newConversation);
    $('forget').addEventListener('click', forgetAll);
    $('copy').addEventListener('click', () => copy(state.live ? state.live.answer : '', $('copy')));
    $('collection-picker').addEventListener('change', switchCollection);
    $('upload').addEventListener('click', uploadFiles);
    $('viewer-close').addEventListener('click', () => $('viewer').close());
    renderConversations();
    start();
  });
})();
