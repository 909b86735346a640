"""`/openapi.json`: every route's request body and answers, described beside the routes.

The routes read their bodies raw (chat's bytes pass through unparsed; uploads are streamed), so
FastAPI sees no body to describe. The models here exist only for the schema: `install` adds
them to FastAPI's own document once, at its first request, with the answers' shapes, the error
body every 4xx/5xx has, and OpenAPI links where one call's id feeds the next (a file → its batch,
a job → its result), which schema fuzzers follow (tests/test_openapi_fuzz.py). Parsing stays as
fast as it was: nothing here runs per request.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from app.documents.job import PROMPTS
from app.paddlex.schema import InferRequest, RestructurePagesRequest

Open = ConfigDict(extra="allow")  # answers may grow fields; a client must ignore unknown ones


class ErrorDetail(BaseModel):
    """OpenAI's error object; `code` is never null on a 4xx the gateway answers itself."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error answer: `{"error": {...}}`."""

    error: ErrorDetail


class PaddleXAnswer(BaseModel):
    """PaddleX's serving envelope around a result (`/layout-parsing`, `/restructure-pages`)."""

    model_config = Open
    logId: str
    errorCode: Literal[0]
    errorMsg: str
    result: dict[str, Any]


class PaddleXError(BaseModel):
    """Every error on PaddleX's routes, in its envelope: `errorCode` is the HTTP status."""

    logId: str
    errorCode: int
    errorMsg: str


class Message(BaseModel):
    """A chat message: `content` a string or a list of parts (text, image_url)."""

    model_config = Open
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(BaseModel):
    """A chat completion request; app/policy.py judges every other field (docs/clients.md)."""

    model_config = Open
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)


class OcrFields(BaseModel):
    """/v1/ocr's options (form fields, or JSON beside `file`); with the layout options
    (docs/ocr.md) these are all it takes (app/documents/upload.py's FIELDS): another field is
    400 `unknown_parameter`."""

    model_config = Open
    task: str = Field(default="ocr", json_schema_extra={"enum": [*PROMPTS]})
    pages: str | None = Field(default=None, description='e.g. "1-3,7"')
    dpi: int = Field(default=144, ge=36, le=600)
    max_tokens: int | None = Field(default=None, ge=1, description="default 4096 (docs/ocr.md)")
    model: str | None = None
    stream: bool = False
    page_images: bool = False
    layout: Literal["auto", "on", "off"] = "auto"
    cache: bool = Field(default=True, description="false: the results cache is bypassed")
    loops: Literal["cut", "retry", "off"] | None = Field(
        default=None, description="the loop guard; default OCRVL_LOOPS (docs/loops.md)"
    )


class OcrUpload(OcrFields):
    """The file as multipart."""

    file: bytes = Field(json_schema_extra={"format": "binary"})


class OcrJson(OcrFields):
    """The file as base64, a data: URL, or an http(s) URL."""

    file: str = Field(min_length=1)


class JobUpload(OcrUpload):
    """A job's document, and where to call back."""

    callback_url: str | None = None


class JobJson(OcrJson):
    """A job's document as JSON, and where to call back."""

    callback_url: str | None = None


class FileUpload(BaseModel):
    """A batch's JSONL input."""

    file: bytes = Field(json_schema_extra={"format": "binary"})
    purpose: Literal["batch"]


Key64 = Annotated[str, StringConstraints(max_length=64)]
Value512 = Annotated[str, StringConstraints(max_length=512)]


class BatchBody(BaseModel):
    """OpenAI's batch create body."""

    input_file_id: str = Field(min_length=1)
    endpoint: Literal["/v1/chat/completions"]
    completion_window: Literal["24h"]
    metadata: dict[Key64, Value512] | None = Field(default=None, max_length=16)


class Job(BaseModel):
    """The `ocr.job` object."""

    model_config = Open
    id: str
    object: Literal["ocr.job"]
    status: Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
    pages_total: int
    pages_done: int
    pages_failed: int
    created_at: int
    usage: dict[str, int]
    error: dict[str, Any] | None


class OcrDocument(BaseModel):
    """/v1/ocr's JSON answer (a job's result too)."""

    model_config = Open
    model: str
    pages: list[dict[str, Any]]
    usage: dict[str, int]


class FileObject(BaseModel):
    """The `file` object."""

    model_config = Open
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: str


class Batch(BaseModel):
    """The `batch` object."""

    model_config = Open
    id: str
    object: Literal["batch"]
    status: str
    input_file_id: str
    request_counts: dict[str, int]


class Deleted(BaseModel):
    """What a DELETE answers."""

    model_config = Open
    id: str
    deleted: Literal[True]


class Listing(BaseModel):
    """OpenAI's list object."""

    model_config = Open
    object: Literal["list"]
    data: list[dict[str, Any]]


class Usage(BaseModel):
    """`GET /v1/usage`."""

    model_config = Open
    object: Literal["usage"]
    key: str
    data: list[dict[str, Any]]
    total: dict[str, int]
    budgets: list[dict[str, Any]]


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}


ERRORS = (400, 401, 404, 413, 429, 502, 503, 504)
DOCUMENT = {**_json(OcrDocument), "application/x-ndjson": {}, "text/markdown": {}}
OCR_BODY = {"multipart/form-data": OcrUpload, "application/json": OcrJson}
JOB_BODY = {"multipart/form-data": JobUpload, "application/json": JobJson}
BY_ID = {"job_id": "$response.body#/id"}
# (method, path) → (operationId, request body by content type, answer status, answer content,
# links from that answer: name → (operationId, link fields))
ROUTES: dict[tuple[str, str], tuple[str, dict[str, Any], int, dict[str, Any], dict[str, Any]]] = {
    ("post", "/v1/chat/completions"): (
        "createChatCompletion", {"application/json": ChatBody}, 200,
        {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}}, {},
    ),
    ("post", "/v1/ocr"): ("readDocument", OCR_BODY, 200, DOCUMENT, {}),
    ("post", "/v1/ocr/jobs"): ("createJob", JOB_BODY, 202, _json(Job), {
        "GetJob": ("getJob", {"parameters": BY_ID}),
        "GetJobResult": ("getJobResult", {"parameters": BY_ID}),
        "CancelJob": ("cancelJob", {"parameters": BY_ID}),
    }),
    ("get", "/v1/ocr/jobs"): ("listJobs", {}, 200, _json(Listing), {}),
    ("get", "/v1/ocr/jobs/{job_id}"): ("getJob", {}, 200, _json(Job), {}),
    ("get", "/v1/ocr/jobs/{job_id}/result"): ("getJobResult", {}, 200, DOCUMENT, {}),
    ("delete", "/v1/ocr/jobs/{job_id}"): ("cancelJob", {}, 200, _json(Job), {}),
    ("post", "/v1/files"): ("createFile", {"multipart/form-data": FileUpload}, 200,
                            _json(FileObject), {
        "CreateBatch": ("createBatch", {"requestBody": {
            "input_file_id": "$response.body#/id", "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}}),
        "GetFile": ("getFile", {"parameters": {"file_id": "$response.body#/id"}}),
        "GetFileContent": ("getFileContent", {"parameters": {"file_id": "$response.body#/id"}}),
        "DeleteFile": ("deleteFile", {"parameters": {"file_id": "$response.body#/id"}}),
    }),
    ("get", "/v1/files"): ("listFiles", {}, 200, _json(Listing), {}),
    ("get", "/v1/files/{file_id}"): ("getFile", {}, 200, _json(FileObject), {}),
    ("get", "/v1/files/{file_id}/content"): ("getFileContent", {}, 200,
                                             {"application/jsonl": {}}, {}),
    ("delete", "/v1/files/{file_id}"): ("deleteFile", {}, 200, _json(Deleted), {}),
    ("post", "/v1/batches"): ("createBatch", {"application/json": BatchBody}, 200, _json(Batch), {
        "GetBatch": ("getBatch", {"parameters": {"batch_id": "$response.body#/id"}}),
        "CancelBatch": ("cancelBatch", {"parameters": {"batch_id": "$response.body#/id"}}),
    }),
    ("get", "/v1/batches"): ("listBatches", {}, 200, _json(Listing), {}),
    ("get", "/v1/batches/{batch_id}"): ("getBatch", {}, 200, _json(Batch), {}),
    ("post", "/v1/batches/{batch_id}/cancel"): ("cancelBatch", {}, 200, _json(Batch), {}),
    ("post", "/layout-parsing"): ("layoutParsing", {"application/json": InferRequest}, 200,
                                  _json(PaddleXAnswer), {}),
    ("post", "/restructure-pages"): ("restructurePages",
                                     {"application/json": RestructurePagesRequest}, 200,
                                     _json(PaddleXAnswer), {}),
    ("get", "/v1/usage"): ("getUsage", {}, 200, _json(Usage), {}),
    ("get", "/v1/models"): ("listModels", {}, 200, _json(Listing), {}),
    ("get", "/health"): ("health", {}, 200, {"application/json": {}}, {}),
    ("get", "/ready"): ("ready", {}, 200, {"application/json": {}}, {}),
    ("get", "/metrics"): ("metrics", {}, 200, {"text/plain": {}}, {}),
}  # fmt: skip
MODELS = (ErrorBody, ChatBody, OcrUpload, OcrJson, JobUpload, JobJson, FileUpload, BatchBody,
          Job, OcrDocument, FileObject, Batch, Deleted, Listing, Usage, InferRequest,
          RestructurePagesRequest, PaddleXAnswer, PaddleXError)  # fmt: skip
# PaddleX's routes answer every error in its envelope, a request it cannot take with 422
PADDLEX = {("post", "/layout-parsing"), ("post", "/restructure-pages")}
# submissions that take an Idempotency-Key (app/idempotency.py): 409 and 422 besides ERRORS
IDEMPOTENT = {("post", "/v1/ocr/jobs"), ("post", "/v1/files"), ("post", "/v1/batches")}
QUERIES: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {  # read by the routes
    ("get", "/v1/ocr/jobs/{job_id}"): [("wait", {"type": "number", "minimum": 0, "maximum": 60})],
    ("get", "/v1/ocr/jobs"): [("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                     ("after", {"type": "string"})],
    ("get", "/v1/files"): [("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}),
                  ("after", {"type": "string"}), ("purpose", {"type": "string"})],
    ("get", "/v1/batches"): [("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                    ("after", {"type": "string"})],
}  # fmt: skip


def _operation(spec: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    """The route's operation in `spec`, made with its path parameters if FastAPI left it out."""
    operation: dict[str, Any] = spec["paths"].setdefault(path, {}).setdefault(method, {})
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    if names and "parameters" not in operation:
        operation["parameters"] = [_parameter(name, "path", {"type": "string"}) for name in names]
    return operation


def _parameter(name: str, where: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


def _describe(spec: dict[str, Any]) -> None:
    """Fill in every route's body, answers and links, in place."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for model in MODELS:
        found = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(found.pop("$defs", {}))
        schemas[model.__name__] = found
    error, paddlex = _json(ErrorBody), _json(PaddleXError)
    for (method, path), (name, body, status, content, links) in ROUTES.items():
        operation = _operation(spec, method, path)
        operation["operationId"] = name
        if body:
            shapes = {kind: {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
                      for kind, model in body.items()}  # fmt: skip
            operation["requestBody"] = {"required": True, "content": shapes}
        operation["parameters"] = operation.get("parameters", []) + [
            _parameter(query, "query", schema) for query, schema in QUERIES.get((method, path), [])
        ]
        answer: dict[str, Any] = {"description": "the answer", "content": content}
        if links:
            answer["links"] = {
                link: {"operationId": target, **fields} for link, (target, fields) in links.items()
            }
        codes, shape = ((*ERRORS, 422), paddlex) if (method, path) in PADDLEX else (ERRORS, error)
        if (method, path) in IDEMPOTENT:
            codes = (*codes, 409, 422)
            header = {"type": "string", "minLength": 1, "maxLength": 255}
            operation["parameters"].append(_parameter("Idempotency-Key", "header", header))
        described = {str(code): {"description": "an error", "content": shape} for code in codes}
        operation["responses"] = {str(status): answer, **described}
    bare = copy.deepcopy(spec["paths"]["/v1/chat/completions"])  # seed recipes' path, the same
    bare["post"]["operationId"] = "createChatCompletionBare"
    spec["paths"]["/chat/completions"] = bare
    schemas.pop("HTTPValidationError", None)  # 422s are 400s here (app/errors.py)
    schemas.pop("ValidationError", None)


def install(app: FastAPI) -> None:
    """Make `app.openapi()` the described document (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _describe(spec)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
