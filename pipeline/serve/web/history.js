// The conversations of the page served by `rag serve`, kept in this browser (localStorage), bounded.
//
// A conversation is {id, collection, title, updated, turns: [{question, answer, sources, stats, state}]}.
// Nothing here leaves the browser; the token is never stored here (it stays in the tab's sessionStorage).
'use strict';

(() => {
  const KEY = 'rag-conversations';
  const CURRENT = 'rag-current-conversation';
  const MAX_CONVERSATIONS = 50;
  const MAX_TURNS = 50;
  const MAX_ANSWER = 20000;  // characters kept of one answer

  function read() {
    try {
      const data = JSON.parse(localStorage.getItem(KEY) || '[]');
      return Array.isArray(data) ? data.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.turns)) : [];
    } catch (e) {
      return [];  // unreadable (another page's data, a quota error earlier): start again
    }
  }

  function write(list) {
    list.sort((a, b) => (b.updated || 0) - (a.updated || 0));
    list.length = Math.min(list.length, MAX_CONVERSATIONS);
    for (;;) {
      try {
        localStorage.setItem(KEY, JSON.stringify(list));
        return;
      } catch (e) {  // over the browser's quota: the oldest go first
        if (!list.length) return;
        list.pop();
      }
    }
  }

  function bounded(turn) {
    return {
      question: String(turn.question || '').slice(0, MAX_ANSWER),
      answer: String(turn.answer || '').slice(0, MAX_ANSWER),
      sources: Array.isArray(turn.sources) ? turn.sources.slice(0, 50) : [],
      stats: turn.stats && typeof turn.stats === 'object' ? turn.stats : null,
      state: turn.state === 'stopped' ? 'stopped' : 'done',
    };
  }

  function newId() {
    const bytes = new Uint8Array(8);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  }

  window.RagHistory = Object.freeze({
    list: read,
    get: (id) => read().find((c) => c.id === id) || null,
    // A new conversation over `collection` (stored once its first turn is added).
    start: (collection) => ({id: newId(), collection, title: '', updated: 0, turns: []}),
    // Adds a turn to `conversation` and stores it; returns the stored conversation.
    add(conversation, turn) {
      const list = read().filter((c) => c.id !== conversation.id);
      const kept = Object.assign({}, conversation, {
        turns: conversation.turns.concat([bounded(turn)]).slice(-MAX_TURNS),
        updated: Date.now(),
        title: conversation.title || String(turn.question || '').slice(0, 120),
      });
      list.push(kept);
      write(list);
      return kept;
    },
    remove: (id) => write(read().filter((c) => c.id !== id)),
    clear: () => localStorage.removeItem(KEY),
    current: () => sessionStorage.getItem(CURRENT),
    setCurrent: (id) => (id ? sessionStorage.setItem(CURRENT, id) : sessionStorage.removeItem(CURRENT)),
  });
})();
