// A small, safe Markdown renderer for the answers on the page served by `rag serve`.
//
// It builds DOM nodes only (createElement, textContent): no string of the answer ever becomes markup,
// so HTML in an answer (`<script>`, `<img onerror>`) is shown as the text it is. It knows what answers
// use: paragraphs, line breaks, headings, lists, block quotes, fenced and indented code, rules, and
// inline code, bold, italics, strikethrough, links (http, https and mailto only; images are shown as
// their text and never loaded) and citations `[n]` / `[n, p. P]`, which become links to source n
// when `cite(n, page)` returns a node. Tables and raw HTML are left as text.
'use strict';

(() => {
  const SAFE_URL = /^(https?:\/\/|mailto:)/i;

  function el(tag, cls) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    return node;
  }

  // -- inline -------------------------------------------------------------------------------------

  // Each rule: a regular expression (sticky at the cursor) and a builder of the node it makes.
  const INLINE = [
    {re: /`+/y, build: codeSpan},
    {re: /!\[([^\]\n]*)\]\(([^)\s]*)\)/y, build: (m, out) => out.append(document.createTextNode(m[1] || m[0]))},
    {re: /\[([^\]\n]+)\]\(([^)\s]+)\)/y, build: link},
    {re: /\[(\d{1,4})((?:\s*,\s*\d{1,4})*)(?:\s*,\s*(?:p|pp|page|pages)\.?\s*(\d{1,5})(?:\s*[-\u2013]\s*\d{1,5})?)?\]/y,
     build: citation},
    {re: /(\*\*|__)(?=\S)([\s\S]*?\S)\1/y, build: strong},
    {re: /~~(?=\S)([\s\S]*?\S)~~/y, build: (m, out, ctx) => wrap('del', m[1], out, ctx)},
    {re: /(\*|_)(?=[^\s*_])([\s\S]*?[^\s*_])\1(?![A-Za-z0-9])/y, build: emphasis},
  ];
  const SPECIAL = /[`!\[*_~]/g;

  function codeSpan(m, out, ctx) {
    const fence = m[0];
    const end = ctx.text.indexOf(fence, ctx.pos);
    if (end < 0) return false;  // no closing run: the backticks are text
    const code = el('code');
    code.textContent = ctx.text.slice(ctx.pos, end).replace(/^ (.*) $/s, '$1');
    out.append(code);
    ctx.pos = end + fence.length;
    return true;
  }

  function link(m, out, ctx) {
    const url = m[2];
    if (!SAFE_URL.test(url)) return false;  // javascript:, data:, relative: not a link
    const a = el('a');
    a.href = url;
    a.target = '_blank';
    a.rel = 'noopener noreferrer nofollow';
    inline(m[1], a, ctx.cite);
    out.append(a);
  }

  function citation(m, out, ctx) {
    const numbers = [m[1], ...m[2].split(',').map((s) => s.trim()).filter(Boolean)].map(Number);
    const page = m[3] ? Number(m[3]) : null;
    const nodes = numbers.map((n) => (ctx.cite ? ctx.cite(n, page) : null));
    if (nodes.some((x) => !x)) return false;  // a number the sources do not hold: plain text
    const span = el('span', 'cite');
    span.append('[');
    nodes.forEach((node, i) => { if (i) span.append(', '); span.append(node); });
    if (page !== null) span.append(m[0].slice(m[0].search(/,\s*(p|pp|page|pages)\b/), -1));
    span.append(']');
    out.append(span);
  }

  // Underscores inside a word are not emphasis (snake_case, __dunder__ in code), nor is a part of a longer
  // run of the delimiter: CommonMark's rules, in short.
  function intraword(m, ctx) {
    const c = m[1][0];
    const before = ctx.text[ctx.start - 1] || '';
    const after = ctx.text[ctx.pos] || '';
    if (before === c || after === c) return true;
    return c === '_' && (/[A-Za-z0-9]/.test(before) || /[A-Za-z0-9]/.test(after));
  }

  function strong(m, out, ctx) {
    if (intraword(m, ctx)) return false;
    wrap('strong', m[2], out, ctx);
  }

  function emphasis(m, out, ctx) {
    if (intraword(m, ctx)) return false;
    wrap('em', m[2], out, ctx);
  }

  function wrap(tag, text, out, ctx) {
    const node = el(tag);
    inline(text, node, ctx.cite);
    out.append(node);
  }

  // Appends the inline Markdown of `text` to `out`.
  function inline(text, out, cite) {
    const ctx = {text, pos: 0, cite};
    let plain = '';
    const flush = () => { if (plain) { out.append(document.createTextNode(plain)); plain = ''; } };
    while (ctx.pos < text.length) {
      SPECIAL.lastIndex = ctx.pos;
      const next = SPECIAL.exec(text);
      if (!next) { plain += text.slice(ctx.pos); break; }
      plain += text.slice(ctx.pos, next.index);
      ctx.pos = next.index;
      let done = false;
      for (const rule of INLINE) {
        rule.re.lastIndex = ctx.pos;
        const m = rule.re.exec(text);
        if (!m) continue;
        const start = ctx.pos;
        flush();
        ctx.start = start;
        ctx.pos = start + m[0].length;
        if (rule.build(m, out, ctx) === false) { ctx.pos = start; continue; }
        done = true;
        break;
      }
      if (!done) { plain += text[ctx.pos]; ctx.pos += 1; }
    }
    flush();
  }

  // -- blocks -------------------------------------------------------------------------------------

  const FENCE = /^ {0,3}(```+|~~~+)\s*([\w+-]*)\s*$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
  const BULLET = /^( {0,3})([-*+])\s+(.*)$/;
  const NUMBERED = /^( {0,3})(\d{1,9})[.)]\s+(.*)$/;
  const QUOTE = /^ {0,3}>\s?(.*)$/;
  const INDENTED = /^( {4}|\t)(.*)$/;

  function paragraph(lines, out, cite) {
    const p = el('p');
    lines.forEach((line, i) => {
      if (i) p.append(el('br'));
      inline(line.trim(), p, cite);
    });
    out.append(p);
  }

  // Renders the Markdown `text` into a new DocumentFragment.
  function render(text, {cite} = {}) {
    const out = document.createDocumentFragment();
    blocks(String(text || '').replace(/\r\n?/g, '\n').split('\n'), out, cite);
    return out;
  }

  function blocks(lines, out, cite) {
    let i = 0;
    let para = [];
    const endPara = () => { if (para.length) { paragraph(para, out, cite); para = []; } };
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (!line.trim()) { endPara(); i += 1; continue; }
      if ((m = FENCE.exec(line))) {
        endPara();
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(m[1])) body.push(lines[i++]);
        i += 1;  // the closing fence (or the end: an answer cut short keeps its code)
        const pre = el('pre');
        const code = el('code');
        if (m[2]) code.dataset.lang = m[2];
        code.textContent = body.join('\n');
        pre.append(code);
        out.append(pre);
        continue;
      }
      if ((m = HEADING.exec(line))) {
        endPara();
        const h = el('h' + Math.min(6, m[1].length + 2));
        inline(m[2], h, cite);
        out.append(h);
        i += 1;
        continue;
      }
      if (RULE.test(line) && !para.length) { out.append(el('hr')); i += 1; continue; }
      if (QUOTE.test(line)) {
        endPara();
        const inner = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) { inner.push(m[1]); i += 1; }
        const q = el('blockquote');
        blocks(inner, q, cite);
        out.append(q);
        continue;
      }
      if (BULLET.test(line) || (NUMBERED.test(line) && (!para.length || /^ {0,3}1[.)]/.test(line)))) {
        endPara();
        i = list(lines, i, out, cite);
        continue;
      }
      if (INDENTED.test(line) && !para.length) {
        const body = [];
        while (i < lines.length && (INDENTED.test(lines[i]) || !lines[i].trim())) {
          body.push(lines[i].replace(/^( {4}|\t)/, ''));
          i += 1;
        }
        while (body.length && !body[body.length - 1].trim()) body.pop();
        const pre = el('pre');
        const code = el('code');
        code.textContent = body.join('\n');
        pre.append(code);
        out.append(pre);
        continue;
      }
      para.push(line);
      i += 1;
    }
    endPara();
  }

  // Whether `line` starts a list item at `indent` spaces or less (a nested one is deeper).
  function marker(line, indent) {
    const m = BULLET.exec(line) || NUMBERED.exec(line);
    return Boolean(m) && m[1].length <= indent;
  }

  // A list starting at lines[i]; returns the index after it. Items are one paragraph each, with
  // continuation lines and nested lists (indented) rendered inside them.
  function list(lines, i, out, cite) {
    const first = BULLET.exec(lines[i]) || NUMBERED.exec(lines[i]);
    const ordered = !BULLET.test(lines[i]);
    const node = el(ordered ? 'ol' : 'ul');
    if (ordered && Number(first[2]) !== 1) node.start = Number(first[2]);
    const indent = first[1].length;
    let item = null;
    while (i < lines.length) {
      const line = lines[i];
      const m = ordered ? NUMBERED.exec(line) : BULLET.exec(line);
      if (m && m[1].length === indent) {
        item = {lines: [m[3]]};
        const li = el('li');
        item.node = li;
        node.append(li);
        i += 1;
        while (i < lines.length && lines[i].trim() && !marker(lines[i], indent) && !FENCE.test(lines[i])
               && !HEADING.test(lines[i])) {
          item.lines.push(lines[i].replace(/^\s{0,4}/, ''));
          i += 1;
        }
        blocks(item.lines, li, cite);
        if (li.childNodes.length === 1 && li.firstChild.tagName === 'P') li.replaceChildren(...li.firstChild.childNodes);
        continue;
      }
      if (!line.trim() && i + 1 < lines.length && (ordered ? NUMBERED : BULLET).test(lines[i + 1])) { i += 1; continue; }
      break;
    }
    out.append(node);
    return i;
  }

  window.RagMarkdown = Object.freeze({render});
})();
