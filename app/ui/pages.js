// One page card (its image beside its text) and the two downloads, in /v1/ocr's own forms.
import { el, markdown, preformatted, sanitisedHtml } from "/ui/render.js";

export function card(number) {
  const article = el("article", "page waiting");
  article.dataset.index = String(number);
  const figure = article.appendChild(el("figure"));
  figure.append(el("div", "placeholder", "waiting for the page…"));
  const text = article.appendChild(el("div", "text"));
  const head = text.appendChild(el("header"));
  head.append(el("h2", "", `Page ${number}`), el("span", "meta", "reading…"));
  return article;
}
function metaText(page) {
  const parts = [`at ${page.seconds.toFixed(1)} s`];
  const usage = page.usage || {};
  if (usage.prompt_tokens !== undefined) {
    parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
  }
  if (page.finish_reason) parts.push(page.finish_reason);
  return parts.join(" · ");
}

function renderText(page, task, body) {
  if (page.html) body.append(sanitisedHtml(page.html));
  else if (task === "formula") body.append(preformatted("latex", page.text || ""));
  else markdown(page.text || "", body);
}

// The page's image (`src`, or a placeholder saying why there is none) and its text.
export function fill(article, page, task, src, placeholder) {
  article.classList.remove("waiting");
  article.classList.toggle("failed", Boolean(page.error));
  const figure = article.querySelector("figure");
  figure.replaceChildren();
  if (src) {
    const image = figure.appendChild(el("img"));
    image.alt = `page ${page.index}`;
    image.src = src;
  } else figure.append(el("div", "placeholder", placeholder));
  const text = article.querySelector(".text");
  text.querySelector(".meta").textContent = page.error ? "failed" : metaText(page);
  if (page.error) {
    text.append(el("p", "page-error", `${page.error.message} (${page.error.code || page.error.type})`));
    return;
  }
  if (page.finish_reason === "length") {
    text.append(el("p", "note", "cut: the page reached max_tokens"));
  }
  const tabs = text.appendChild(el("div", "tabs"));
  const rendered = text.appendChild(el("div", "rendered"));
  const source = text.appendChild(preformatted("source", page.text || ""));
  source.hidden = true;
  renderText(page, task, rendered);
  for (const [label, shows] of [["rendered", rendered], ["source", source]]) {
    const tab = tabs.appendChild(el("button", `tab tab-${label}`, label));
    tab.type = "button";
    tab.setAttribute("aria-pressed", String(shows === rendered));
    tab.addEventListener("click", () => {
      rendered.hidden = shows !== rendered;
      source.hidden = shows !== source;
      for (const other of tabs.children) other.setAttribute("aria-pressed", String(other === tab));
    });
  }
}

// The same two forms /v1/ocr gives (Accept: text/markdown, application/json), from the
// pages read here, so a download equals what the API would have answered.
function ordered(result) {
  return [...result.pages.values()].sort((a, b) => a.index - b.index);
}

export function asMarkdown(result) {
  const parts = ordered(result).map((page) =>
    page.error ? `<!-- page ${page.index} failed: ${page.error.message} -->`
      : page.html || page.text || "");
  return `${parts.join("\n\n")}\n`;
}

export function asJson(result) {
  const usage = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
  const pages = ordered(result).map((page) => {
    const { object, image, seconds, ...shown } = page; // eslint-disable-line no-unused-vars
    for (const name of Object.keys(usage)) usage[name] += (page.usage || {})[name] || 0;
    return shown;
  });
  return `${JSON.stringify({ model: result.model, pages, usage }, null, 2)}\n`;
}

export function download(name, type, text) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = el("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
