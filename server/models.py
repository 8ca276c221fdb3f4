"""Request and response bodies of the plan service (pydantic), as the OpenAPI document shows them.

The interchange formats themselves (``ucudnn-benchmark-table/1``,
``ucudnn-plan/1``) are validated by ``ucudnn.planning.table`` / ``ucudnn.planning.plan`` against
their JSON Schemas, not re-described here: one schema per format.  These
models only describe the envelopes around them, and refuse unknown fields so
a typo (``workspace-limit``) is an error naming the field, not a silent default.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, WithJsonSchema

ID_PATTERN = r"^[0-9a-f]{1,64}$"
# Sizes and pairs are checked by ucudnn.units.parse_size / ucudnn.problem (one place, errors naming the
# field); pydantic only documents them, so its union errors ("workspace_limit.int") never reach users.
Size = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}],
                                      "description": "bytes, or a string such as '64MiB' or '1.5GB'"})]
Pair = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0},
                                                {"type": "array", "items": {"type": "integer", "minimum": 0},
                                                 "minItems": 2, "maxItems": 2}]})]
Op = Literal["forward", "backward_data", "backward_filter"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: ``detail`` says what is wrong, ``field`` names the offending field."""

    detail: str
    field: str | None = None
    min_workspace: int | None = Field(None, description="409 only: the smallest budget (bytes) under which a plan exists")
    min_workspace_human: str | None = None
    errors: list[dict[str, Any]] | None = None


class TableCreated(BaseModel):
    id: str = Field(description="content hash of the table: the same measurements always get the same id")
    numerics: str | None = Field(None, description="the numerics the table's plans are made under: its own field, or "
                                                   "what a table without one is taken to have")
    numerics_note: str | None = Field(None, description="only for a table without a numerics field: how it was "
                                                        "taken, e.g. 'no numerics field; taken as strict (float32 "
                                                        "default)'")


class TableSummary(BaseModel):
    id: str
    device: str
    cudnn_version: int
    numerics: str | None = None
    kernels: int
    created_at: float


class PlanRequest(_Strict):
    """Plan a stored table (``table_id``) or one sent inline (``table``) under a policy."""

    table_id: str | None = Field(None, pattern=ID_PATTERN, description="id from POST /v1/tables")
    table: dict[str, Any] | None = Field(None, description="an inline ucudnn-benchmark-table/1 document "
                                                           "(stored too, as POST /v1/tables would)")
    policy: Literal["wr", "wd", "undivided"] = Field(
        "wr", description="wr: each kernel under workspace_limit; wd: the whole table shares total_workspace; "
                          "undivided: plain cuDNN under workspace_limit")
    workspace_limit: Size | None = Field(None, description="per-kernel limit for wr/undivided, e.g. '64MiB'")
    total_workspace: Size | None = Field(None, description="whole-table budget for wd, e.g. '120MiB'")
    batch_policy: str = Field("powerOfTwo", description="all | powerOfTwo | powerOfTwoAndMidpoints | powerOfTwoAndEvenSplits | undivided")
    unwritten: bool = Field(False, description="wr only: a kernel may take a micro-batch's workspace from output "
                                               "its call has not written yet (marked workspace_from: unwritten)")
    host_ties: bool = Field(True, description="wr / undivided: at one micro-batch size, a configuration at most 2% "
                                              "slower that saves the host at least twice the time it gives up is "
                                              "taken (10% where the fastest is a cuDNN legacy call without a "
                                              "graph-API twin, its host work counted at least 0.1 ms; tables that "
                                              "record host_ms); false: the fastest")


class PlanResponse(BaseModel):
    """A ``ucudnn-plan/1`` document plus ``id`` (for GET /v1/plans/{id}) and the ``table_id`` it was planned from."""

    model_config = ConfigDict(extra="allow")
    id: str
    table_id: str | None = None
    format: Literal["ucudnn-plan/1"]
    policy: str
    batch_policy: str
    total_time_ms: float
    workspace_bytes: int
    kernels: list[dict[str, Any]]


class ProblemIn(_Strict):
    """One convolution to benchmark (``ucudnn.problem.ConvProblem``); ``n`` is the mini-batch size."""

    name: str | None = Field(None, min_length=1, max_length=200)
    n: StrictInt
    c: StrictInt
    h: StrictInt
    w: StrictInt
    k: StrictInt
    r: StrictInt
    s: StrictInt
    pad: Pair = 0
    stride: Pair = 1
    dilation: Pair = 1
    groups: StrictInt = 1
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    layout: Literal["NCHW", "NHWC"] = "NCHW"


class JobRequest(_Strict):
    """Benchmark problems on the server's GPU; the result lands as a stored table."""

    problems: list[ProblemIn] = Field(min_length=1, max_length=1024)
    ops: list[Op] = Field(default_factory=lambda: ["forward", "backward_data", "backward_filter"], min_length=1,
                          max_length=3)
    batch_policy: str = "powerOfTwo"
    numerics: str | None = Field(None, description="strict | tf32 | default (ucudnn.numerics); default: by dtype")


class JobStatus(BaseModel):
    id: str
    status: Literal["queued", "running", "done", "failed"]
    progress: float = Field(ge=0, le=1, description="fraction of distinct kernels measured")
    done: int
    total: int
    message: str | None = None
    table_id: str | None = Field(None, description="the result table (GET /v1/tables/{id}) once done")
    created_at: float
    updated_at: float


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    store: str = Field(description="database dialect of the store (sqlite, postgresql)")
    gpu: bool | None = Field(None, description="whether benchmark jobs can run here (None: not checked yet)")
