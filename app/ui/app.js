// The /ui page: one document through POST /v1/ocr (NDJSON), or as a job (/v1/ocr/jobs) with a
// progress bar; each page shown as it arrives (pages.js), its text rendered safely (render.js).
import { asJson, asMarkdown, card, download, fill } from "/ui/pages.js";

const KEY_SLOT = "ocrvl.apiKey";
const SHOWN_IMAGES = new Set(["image/png", "image/jpeg", "image/webp", "image/bmp", "image/gif"]);

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("setup"), key: $("key"), forget: $("forget"), drop: $("drop"), file: $("file"),
  fileName: $("file-name"), task: $("task"), pages: $("pages"), maxTokens: $("max-tokens"),
  layout: $("layout"), orientation: $("orientation"), unwarp: $("unwarp"),
  pageImages: $("page-images"), asJob: $("as-job"), run: $("run"), stop: $("stop"),
  downloadMd: $("download-md"), downloadJson: $("download-json"), progress: $("progress"),
  message: $("message"), error: $("error"), errorTitle: $("error-title"),
  errorDetail: $("error-detail"), list: $("results"),
};

let chosen = null; // the File to read
let localImage = null; // an object URL of `chosen` when the browser can show it
let controller = null; // aborts the request in flight
let jobUrl = null; // the job being followed (job mode): DELETE cancels it
const JOB_POLL_MS = 1000;
const JOB_ACTIVE = new Set(["queued", "running"]);
let result = null; // {model, numbers, pages: Map(index -> page), usage, name, done, job}

// ------------------------------------------------------------------ the key and the file

ui.key.value = sessionStorage.getItem(KEY_SLOT) || "";
ui.key.addEventListener("change", () => sessionStorage.setItem(KEY_SLOT, ui.key.value.trim()));
ui.forget.addEventListener("click", () => {
  sessionStorage.removeItem(KEY_SLOT);
  ui.key.value = "";
});

function choose(file) {
  if (!file) return;
  chosen = file;
  if (localImage) URL.revokeObjectURL(localImage);
  localImage = SHOWN_IMAGES.has(file.type) ? URL.createObjectURL(file) : null;
  ui.fileName.textContent = `${file.name} (${Math.ceil(file.size / 1024)} KiB)`;
}

ui.file.addEventListener("change", () => choose(ui.file.files[0]));
ui.drop.addEventListener("dragover", (event) => {
  event.preventDefault();
  ui.drop.classList.add("over");
});
ui.drop.addEventListener("dragleave", () => ui.drop.classList.remove("over"));
ui.drop.addEventListener("drop", (event) => {
  event.preventDefault();
  ui.drop.classList.remove("over");
  choose(event.dataTransfer.files[0]);
});

// ------------------------------------------------------------------ errors, in words

function describe(status, code, retryAfter) {
  const retry = retryAfter ? ` Retry after ${retryAfter} s (the server's Retry-After).` : "";
  if (status === 401) return "The API key was refused (401): check the key above.";
  if (status === 403) return "This key may not do that (403).";
  if (code === "too_many_pages") return "Too many pages (400): choose fewer in “Pages”.";
  if (status === 413) return "The file is too large (413).";
  if (status === 429) return `Too many requests for this key (429).${retry}`;
  if (status === 503) return `The server is overloaded or has no engine up (503).${retry}`;
  if (status === 404) return "Not found (404).";
  if (status >= 400 && status < 500) return `The request was refused (${status}).`;
  return `The gateway answered ${status}.${retry}`;
}

function showError(title, detail) {
  document.body.dataset.state = "failed";
  ui.errorTitle.textContent = title;
  ui.errorDetail.textContent = detail || "";
  ui.error.hidden = false;
}

async function showApiError(response) {
  let error = {};
  try {
    error = (await response.json()).error || {};
  } catch {
    error = { message: "(the answer was not JSON)" };
  }
  const title = describe(response.status, error.code, response.headers.get("retry-after"));
  const where = [error.code && `code ${error.code}`, error.param && `param ${error.param}`];
  const extra = where.filter(Boolean).join(", ");
  showError(title, `The gateway said: ${error.message || "nothing"}${extra ? ` (${extra})` : ""}`);
}

function pageImage(page) {
  if (page.image) return page.image; // the page as the model read it (page_images)
  if (localImage && result.numbers.length === 1) return localImage; // the picked image
  return null;
}

function placeholderText(page) {
  if (page.error) return "no image: the page failed";
  if (result.job) return "no page image: a job keeps only the text";
  if (chosen && chosen.type === "application/pdf") return "no page image (tick “page images”)";
  return "this browser cannot show the file's pages (tick “page images”)";
}

// ------------------------------------------------------------------ the stream

function progress(done, total) {
  ui.progress.max = Math.max(total, 1);
  ui.progress.value = done;
  ui.progress.hidden = false;
  document.body.dataset.progress = `${done}/${total}`;
  ui.message.textContent = `${done} of ${total} pages read`;
}

function onLine(event, started, task) {
  if (event.object === "ocr.document") {
    if (result.numbers.length) return; // a job's result, fetched again: the cards are there
    result.model = event.model;
    result.numbers = event.pages;
    ui.list.replaceChildren(...event.pages.map(card));
    if (!result.job) progress(0, event.pages.length); // a job's progress is its own
  } else if (event.object === "ocr.page") {
    if (result.pages.has(event.index)) return;
    event.seconds = (performance.now() - started) / 1000;
    result.pages.set(event.index, event);
    const article = ui.list.querySelector(`article[data-index="${event.index}"]`);
    if (article) fill(article, event, task, pageImage(event), placeholderText(event));
    if (!result.job) progress(result.pages.size, result.numbers.length);
  } else if (event.object === "ocr.summary" && (!result.job || result.job.ended)) {
    result.usage = event.usage;
    result.done = true;
    document.body.dataset.state = "done"; // for styles and for the browser tests
    const seconds = (performance.now() - started) / 1000;
    const failed = event.failed ? `, ${event.failed} failed` : "";
    ui.message.textContent =
      `${event.pages} page${event.pages === 1 ? "" : "s"} in ${seconds.toFixed(1)} s ` +
      `(${(event.pages / seconds).toFixed(2)} pages/s)${failed}; ` +
      `${event.usage.completion_tokens} completion tokens; model ${result.model}`;
  }
}

async function readLines(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffered += decoder.decode(value || new Uint8Array(), { stream: !done });
    const lines = buffered.split("\n");
    buffered = lines.pop();
    for (const line of lines) if (line.trim()) onEvent(JSON.parse(line));
    if (done) break;
  }
  if (buffered.trim()) onEvent(JSON.parse(buffered));
}

// A job (POST /v1/ocr/jobs): its status polled for the progress bar, its kept pages fetched
// (NDJSON, the same lines as the stream) whenever more are done; the pages in flight are
// cancelled by Stop (DELETE).
async function followJob(response, headers, started, task) {
  let job = await response.json();
  jobUrl = `/v1/ocr/jobs/${encodeURIComponent(job.id)}`;
  result.job = { id: job.id, ended: false, total: job.pages_total };
  let shown = -1;
  for (;;) {
    progress(job.pages_done, job.pages_total);
    ui.message.textContent += ` (job ${job.id}, ${job.status})`;
    const ended = !JOB_ACTIVE.has(job.status);
    if (job.pages_done !== shown || ended) {
      result.job.ended = ended;
      const kept = await fetch(`${jobUrl}/result`, {
        headers: { ...headers, accept: "application/x-ndjson" }, signal: controller.signal,
      });
      if (!kept.ok) return showApiError(kept);
      await readLines(kept, (line) => onLine(line, started, task));
      shown = job.pages_done;
    }
    if (ended) break;
    await new Promise((resolve) => setTimeout(resolve, JOB_POLL_MS));
    const polled = await fetch(jobUrl, { headers, signal: controller.signal });
    if (!polled.ok) return showApiError(polled);
    job = await polled.json();
  }
  if (job.status !== "succeeded") {
    const why = job.error ? `: ${job.error.message || JSON.stringify(job.error)}` : "";
    showError(`The job ended ${job.status}${why}.`);
  }
  return undefined;
}

async function cancelJob(headers) {
  if (!jobUrl) return;
  const url = jobUrl;
  jobUrl = null;
  await fetch(url, { method: "DELETE", headers }).catch(() => undefined);
}

function requestBody(task) {
  const body = new FormData();
  body.append("file", chosen, chosen.name);
  body.append("task", task);
  if (ui.pages.value.trim()) body.append("pages", ui.pages.value.trim());
  if (ui.maxTokens.value.trim()) body.append("max_tokens", ui.maxTokens.value.trim());
  body.append("layout", ui.layout.value);
  if (ui.orientation.checked) body.append("orientation", "true");
  if (ui.unwarp.checked) body.append("unwarp", "true");
  // plain markdown (figures as ![](path), tables as HTML), which the page draws; the pretty
  // form wraps them in centred <div> HTML, which it would show as text
  body.append("prettify_markdown", "false");
  if (ui.pageImages.checked && !ui.asJob.checked) body.append("page_images", "true");
  return body;
}

function busy(running) {
  ui.run.disabled = running;
  ui.stop.disabled = !running;
  const pagesIn = Boolean(result && result.pages.size);
  ui.downloadMd.disabled = running || !pagesIn;
  ui.downloadJson.disabled = running || !pagesIn;
}

async function run(event) {
  event.preventDefault();
  ui.error.hidden = true;
  if (!chosen) {
    showError("Choose a file first: an image or a PDF.");
    return;
  }
  const key = ui.key.value.trim();
  sessionStorage.setItem(KEY_SLOT, key);
  const task = ui.task.value;
  const name = chosen.name.replace(/\.[^.]*$/, "") || "document";
  result = {
    model: null, numbers: [], pages: new Map(), usage: null, name, done: false, job: null,
  };
  jobUrl = null;
  ui.list.replaceChildren();
  ui.progress.hidden = true;
  ui.message.textContent = `sending ${chosen.name}…`;
  controller = new AbortController();
  document.body.dataset.state = "running";
  busy(true);
  const started = performance.now();
  const headers = { accept: "application/x-ndjson" };
  if (key) headers.authorization = `Bearer ${key}`;
  const asJob = ui.asJob.checked;
  try {
    const response = await fetch(asJob ? "/v1/ocr/jobs" : "/v1/ocr", {
      method: "POST", headers, body: requestBody(task), signal: controller.signal,
    });
    if (!response.ok) {
      ui.message.textContent = "";
      await showApiError(response);
      return;
    }
    if (asJob) await followJob(response, headers, started, task);
    else await readLines(response, (line) => onLine(line, started, task));
    if (!result.done && document.body.dataset.state === "running") {
      showError("The answer ended early: the connection was cut.");
    }
  } catch (error) {
    if (error.name === "AbortError") {
      await cancelJob(headers);
      const total = result.numbers.length || (result.job ? result.job.total : 0);
      ui.message.textContent = `Stopped: ${result.pages.size} of ${total} pages read.`;
      document.body.dataset.state = "stopped";
    } else showError("The gateway could not be reached, or its answer was cut.", String(error));
  } finally {
    controller = null;
    busy(false);
  }
}

ui.asJob.addEventListener("change", () => {
  ui.pageImages.disabled = ui.asJob.checked; // a job keeps no page images
});
ui.form.addEventListener("submit", run);
ui.stop.addEventListener("click", () => controller && controller.abort());

ui.downloadMd.addEventListener("click", () =>
  download(`${result.name}.md`, "text/markdown", asMarkdown(result)));
ui.downloadJson.addEventListener("click", () =>
  download(`${result.name}.json`, "application/json", asJson(result)));
