// A page read block by block (a layout): each block's box drawn over the page image, coloured
// by its label, beside the list of its blocks; pointing at or clicking one marks the other.
// Labels and texts are model or service output: text nodes only, never markup.
import { el, markdown, preformatted, sanitisedHtml } from "/ui/render.js";

const COLOURS = 12; // style.css: .c0 … .c11

// The colour class of a label: the same label has the same colour on every page.
export function colourOf(label) {
  let hash = 7;
  for (const char of String(label)) hash = (hash * 31 + char.codePointAt(0)) >>> 0;
  return `c${hash % COLOURS}`;
}

// The page image with a box per block, placed in percent of the image once its size is known
// (the blocks' bboxes are in the pixels of the page the layout service read, this image).
export function layoutFigure(figure, page, src) {
  const frame = figure.appendChild(el("div", "layout"));
  const image = frame.appendChild(el("img"));
  image.alt = `page ${page.index}`;
  const over = frame.appendChild(el("div", "boxes"));
  const boxes = page.blocks.map((block) => {
    const box = over.appendChild(el("div", `box ${colourOf(block.label)}`));
    box.dataset.index = String(block.index);
    box.dataset.label = String(block.label);
    box.title = `${block.index}: ${block.label}`;
    return box;
  });
  image.addEventListener("load", () => {
    const [width, height] = [image.naturalWidth, image.naturalHeight];
    page.blocks.forEach((block, n) => {
      const [x1, y1, x2, y2] = block.bbox;
      Object.assign(boxes[n].style, { // CSSOM, not a style attribute: the CSP allows it
        left: `${(100 * x1) / width}%`, top: `${(100 * y1) / height}%`,
        width: `${(100 * (x2 - x1)) / width}%`, height: `${(100 * (y2 - y1)) / height}%`,
      });
    });
    frame.dataset.placed = "true";
  });
  image.src = src;
  return boxes;
}

function blockBody(block, images, body) {
  if (block.error) body.append(el("p", "page-error", block.error.message || "failed"));
  else if (block.html) body.append(sanitisedHtml(block.html));
  else if (block.latex !== undefined) body.append(preformatted("latex", block.latex));
  else if (block.image && images && typeof images[block.image] === "string") {
    markdown(`![${block.label}](${block.image})`, body, images);
  } else markdown(block.text || "", body, {});
}

// The blocks in reading order, each with its label and its text.
export function blockList(page) {
  const list = el("ol", "blocks");
  const items = page.blocks.map((block) => {
    const item = list.appendChild(el("li", `block ${colourOf(block.label)}`));
    item.dataset.index = String(block.index);
    item.tabIndex = 0;
    item.append(el("span", "label", block.label));
    blockBody(block, page.images, item.appendChild(el("div", "block-text")));
    return item;
  });
  return [list, items];
}

// Pointing at a box or a block marks both; a click picks them (and scrolls to the other).
export function link(boxes, items) {
  boxes.forEach((box, n) => {
    const item = items[n];
    const pair = [box, item];
    const mark = (on) => () => pair.forEach((node) => node.classList.toggle("hot", on));
    const pick = (other) => () => {
      for (const node of document.querySelectorAll(".picked")) node.classList.remove("picked");
      pair.forEach((node) => node.classList.add("picked"));
      other.scrollIntoView({ block: "nearest" });
    };
    for (const node of pair) {
      node.addEventListener("mouseenter", mark(true));
      node.addEventListener("mouseleave", mark(false));
    }
    box.addEventListener("click", pick(item));
    item.addEventListener("click", pick(box));
  });
}
