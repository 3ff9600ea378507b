"""A worker's spans, as ``opentelemetry-instrumentation-celery`` makes them, written to a file.

With ``CSL_OTEL_SPANS=<path>`` the test app has each pool process set a tracer provider
whose spans are appended to ``path`` (one JSON object a line) as they end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:  # O_APPEND: whole lines from each pool process
            for span in spans:
                out.write(json.dumps(json.loads(span.to_json())) + "\n")
        return SpanExportResult.SUCCESS


def export_spans_to(path: str) -> None:
    def _instrument(**_: Any) -> None:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
        trace.set_tracer_provider(provider)
        CeleryInstrumentor().instrument(tracer_provider=provider)

    worker_process_init.connect(_instrument, weak=False)


def read_spans(path: str) -> list[dict[str, Any]]:
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
