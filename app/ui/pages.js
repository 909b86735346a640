// One page card (its image beside its text) and the two downloads, in /v1/ocr's own forms.
import { blockList, layoutFigure, link } from "/ui/layout.js";
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
  if (page.markdown !== undefined) markdown(page.markdown, body, page.images || {});
  else if (page.html) body.append(sanitisedHtml(page.html));
  else if (task === "formula") body.append(preformatted("latex", page.text || ""));
  else markdown(page.text || "", body);
}

// The page's image (`src`, or a placeholder saying why there is none) and its text.
export function fill(article, page, task, src, placeholder) {
  article.classList.remove("waiting");
  article.classList.toggle("failed", Boolean(page.error));
  const figure = article.querySelector("figure");
  figure.replaceChildren();
  const layout = Array.isArray(page.blocks) && !page.error;
  article.classList.toggle("has-layout", layout);
  let boxes = null;
  if (src && layout) boxes = layoutFigure(figure, page, src);
  else if (src) {
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
  const views = [];
  if (layout) { // the blocks beside the boxes first, then the page's markdown
    const [list, items] = blockList(page);
    if (boxes) link(boxes, items);
    views.push(["blocks", text.appendChild(list)]);
  }
  const rendered = text.appendChild(el("div", "rendered"));
  renderText(page, task, rendered);
  const source = text.appendChild(preformatted("source", page.text || ""));
  views.push(["rendered", rendered], ["source", source]);
  views.forEach(([label, view], n) => {
    view.hidden = n > 0;
    const tab = tabs.appendChild(el("button", `tab tab-${label}`, label));
    tab.type = "button";
    tab.setAttribute("aria-pressed", String(n === 0));
    tab.addEventListener("click", () => {
      for (const [, other] of views) other.hidden = other !== view;
      for (const other of tabs.children) other.setAttribute("aria-pressed", String(other === tab));
    });
  });
}

// The same two forms /v1/ocr gives (Accept: text/markdown, application/json), from the
// pages read here, so a download equals what the API would have answered.
function ordered(result) {
  return [...result.pages.values()].sort((a, b) => a.index - b.index);
}

export function asMarkdown(result) {
  const parts = ordered(result).flatMap((page) =>
    page.error ? [`<!-- page ${page.index} failed: ${page.error.message} -->`]
      : [page.html || page.text || "",
        ...(page.finish_reason === "length"
          ? [`<!-- page ${page.index} was cut at max_tokens: its text is incomplete -->`] : [])]);
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
