// Model text as page content, safely: every node is made with createElement and text nodes;
// HTML (a table) goes through an allow-list tokenizer, never through a browser HTML parser.

const TABLE_TAGS = new Set(["table", "thead", "tbody", "tr", "td", "th"]);

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// ------------------------------------------------------------------ markdown, safely

const INLINE = new RegExp(
  [
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1", // 1-2 code
    "\\$([^$\\n]+)\\$", // 3 inline LaTeX
    "\\*\\*([^*\\n]+)\\*\\*|__([^_\\n]+)__", // 4-5 bold
    "\\*([^*\\s][^*\\n]*)\\*", // 6 italic
    "(!?)\\[([^\\]\\n]*)\\]\\(([^)\\s]*)\\)", // 7-9 image or link
  ].join("|"),
  "g",
);

// The figure crops of the page being drawn (markdown path -> the gateway's data: URL); a
// markdown image shows one only when its path is one of them.
let figures = {};
const CROP = /^data:image\/(jpeg|png);base64,[A-Za-z0-9+/=]+$/;

function figureOf(path) {
  const url = Object.hasOwn(figures, path) ? figures[path] : null;
  return typeof url === "string" && CROP.test(url) ? url : null;
}

// An absolute http(s) URL, or null: javascript:, data:, relative and other links stay text.
function safeHref(href) {
  try {
    const url = new URL(href); // no base: a relative link throws
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

function inline(text, parent) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) parent.append(text.slice(last, match.index));
    last = match.index + match[0].length;
    if (match[2] !== undefined) parent.append(el("code", "", match[2]));
    else if (match[3] !== undefined) parent.append(el("code", "latex", `$${match[3]}$`));
    else if (match[4] !== undefined || match[5] !== undefined) {
      parent.append(el("strong", "", match[4] ?? match[5]));
    } else if (match[6] !== undefined) parent.append(el("em", "", match[6]));
    else if (match[7] === "!" && figureOf(match[9])) { // one of the page's own figure crops
      const image = el("img", "figure");
      image.alt = match[8] || match[9];
      image.src = figureOf(match[9]);
      parent.append(image);
    } else {
      const href = match[7] === "" ? safeHref(match[9]) : null; // other images never load
      if (href === null) parent.append(match[0]); // javascript:, data:, images: as text
      else {
        const link = el("a", "", match[8] || href);
        link.href = href;
        link.rel = "noopener noreferrer nofollow";
        link.target = "_blank";
        parent.append(link);
      }
    }
  }
  if (last < text.length) parent.append(text.slice(last));
}

const FENCE = /^\s*(```|~~~)/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const ITEM = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const PIPE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const isPipeRule = (line) => line !== undefined && line.includes("|") && PIPE_RULE.test(line);
const MATH = /^\s*\$\$/;
const TABLE_START = /^\s*<table/i;

function startsBlock(line, next) {
  return (
    FENCE.test(line) || HEADING.test(line) || RULE.test(line) || ITEM.test(line) ||
    QUOTE.test(line) || MATH.test(line) || TABLE_START.test(line) ||
    (line.includes("|") && isPipeRule(next))
  );
}

function takeWhile(lines, i, keep) {
  const taken = [];
  while (i < lines.length && keep(lines[i])) taken.push(lines[i++]);
  return [taken, i];
}

function pipeCells(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
}

function pipeTable(header, rows) {
  const table = el("table");
  const head = table.appendChild(el("thead")).appendChild(el("tr"));
  for (const cell of pipeCells(header)) inline(cell, head.appendChild(el("th")));
  const body = table.appendChild(el("tbody"));
  for (const row of rows) {
    const tr = body.appendChild(el("tr"));
    for (const cell of pipeCells(row)) inline(cell, tr.appendChild(el("td")));
  }
  return table;
}

export function preformatted(className, text) {
  const pre = el("pre", className);
  pre.append(el("code", "", text));
  return pre;
}

// One block from lines[i] into `parent`; the index of the line after it.
function block(lines, i, parent) {
  const line = lines[i];
  let taken;
  let j;
  if (FENCE.test(line)) {
    const fence = line.match(FENCE)[1];
    [taken, j] = takeWhile(lines, i + 1, (l) => !l.trim().startsWith(fence));
    parent.append(preformatted("code", taken.join("\n")));
    return j + 1;
  }
  if (MATH.test(line)) { // $$ … $$ on one line or several: LaTeX source, as written
    const trimmed = line.trim();
    taken = [line];
    j = i;
    if (trimmed.length < 4 || !trimmed.endsWith("$$")) {
      [taken, j] = takeWhile(lines, i + 1, (l) => !l.trim().endsWith("$$"));
      taken = [line, ...taken, ...(j < lines.length ? [lines[j]] : [])];
    }
    parent.append(preformatted("latex", taken.join("\n")));
    return j + 1;
  }
  if (TABLE_START.test(line)) { // an HTML table the model wrote: through the allow-list
    [taken, j] = takeWhile(lines, i, (l) => !/<\/table>/i.test(l));
    if (j < lines.length) taken.push(lines[j]);
    parent.append(sanitisedHtml(taken.join("\n")));
    return j + 1;
  }
  if (HEADING.test(line)) {
    const [, marks, content] = line.match(HEADING);
    inline(content, parent.appendChild(el(`h${Math.min(marks.length + 1, 6)}`)));
    return i + 1;
  }
  if (RULE.test(line)) {
    parent.append(el("hr"));
    return i + 1;
  }
  if (line.includes("|") && isPipeRule(lines[i + 1])) {
    [taken, j] = takeWhile(lines, i + 2, (l) => l.includes("|") && l.trim() !== "");
    parent.append(pipeTable(line, taken));
    return j;
  }
  if (QUOTE.test(line)) {
    [taken, j] = takeWhile(lines, i, (l) => QUOTE.test(l));
    const quote = parent.appendChild(el("blockquote"));
    markdown(taken.map((l) => l.match(QUOTE)[1]).join("\n"), quote);
    return j;
  }
  if (ITEM.test(line)) {
    [taken, j] = takeWhile(lines, i, (l) => ITEM.test(l));
    const list = parent.appendChild(el(/\d/.test(line.match(ITEM)[1]) ? "ol" : "ul"));
    for (const item of taken) inline(item.match(ITEM)[2], list.appendChild(el("li")));
    return j;
  }
  const paragraph = parent.appendChild(el("p"));
  inline(line, paragraph);
  for (j = i + 1; j < lines.length; j++) {
    if (!lines[j].trim() || startsBlock(lines[j], lines[j + 1])) break;
    paragraph.append(el("br")); // OCR lines are lines: keep the breaks
    inline(lines[j], paragraph);
  }
  return j;
}

// `images`: the page's figure crops its markdown may show (`images` of a /v1/ocr page).
export function markdown(text, parent, images) {
  const outer = figures;
  if (images !== undefined) figures = images || {};
  try {
    const lines = text.replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) i = lines[i].trim() ? block(lines, i, parent) : i + 1;
  } finally {
    figures = outer;
  }
}

// ------------------------------------------------------------------ HTML tables, allow-listed

// No browser HTML parser ever sees model text: this tokenizer makes elements only for the
// table tags, copies only numeric rowspan/colspan, and turns every other tag into text.
const TAG = /<(\/?)([a-zA-Z][\w-]*)((?:[^>"']|"[^"]*"|'[^']*')*)>/g;
const SPAN = /\b(rowspan|colspan)\s*=\s*(?:"([1-9]\d{0,3})"|'([1-9]\d{0,3})'|([1-9]\d{0,3}))/gi;
const ENTITY = /&(#x[0-9a-f]{1,6}|#\d{1,7}|amp|lt|gt|quot|apos|nbsp);/gi;
const NAMED = { amp: "&", lt: "<", gt: ">", quot: '"', apos: "'", nbsp: "\u00a0" };

function decoded(text) {
  return text.replace(ENTITY, (whole, name) => {
    const lower = name.toLowerCase();
    if (!lower.startsWith("#")) return NAMED[lower];
    const code = lower.startsWith("#x") ? parseInt(lower.slice(2), 16) : Number(lower.slice(1));
    return code > 0 && code <= 0x10ffff ? String.fromCodePoint(code) : whole;
  });
}

export function sanitisedHtml(html) {
  const out = document.createDocumentFragment();
  const open = [out]; // the elements still open, innermost last
  const top = () => open[open.length - 1];
  let last = 0;
  for (const match of html.matchAll(TAG)) {
    if (match.index > last) top().append(decoded(html.slice(last, match.index)));
    last = match.index + match[0].length;
    const [source, closing, name, attributes] = match;
    const tag = name.toLowerCase();
    if (!TABLE_TAGS.has(tag)) {
      top().append(source); // <script>, <img onerror=…>, <a href=…>: shown as written
    } else if (closing) {
      const at = open.findLastIndex((node) => node.localName === tag);
      if (at > 0) open.length = at;
    } else {
      const element = document.createElement(tag);
      for (const [, attribute, double, single, bare] of attributes.matchAll(SPAN)) {
        element.setAttribute(attribute.toLowerCase(), double ?? single ?? bare);
      }
      top().append(element);
      open.push(element);
    }
  }
  if (last < html.length) top().append(decoded(html.slice(last)));
  return out;
}
