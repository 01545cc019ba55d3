"""What the OpenTelemetry tests share: the tools' versions and a fixture that builds a
processor on a store with a tracer of a fresh provider feeding it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from mnestoma.recording.otel import MnestomaSpanProcessor

VERSIONS = {"fs.search": "1.2", "fs.read": "2.0", "pdf.text": "0.9"}
Setup = Callable[..., tuple[MnestomaSpanProcessor, Tracer]]


@pytest.fixture(name="setup")
def otel_setup() -> Iterator[Setup]:
    """``setup(store, **options)``: a processor on ``store`` (the tools' versions from
    :data:`VERSIONS` unless given) and a tracer of a fresh provider feeding it; the
    providers are shut down after the test."""
    providers: list[TracerProvider] = []

    def make(store: Any, **options: Any) -> tuple[MnestomaSpanProcessor, Tracer]:
        options.setdefault("version_of", VERSIONS)
        processor = MnestomaSpanProcessor(store, **options)
        provider = TracerProvider()
        provider.add_span_processor(processor)
        providers.append(provider)
        return processor, provider.get_tracer("test")

    yield make
    for provider in providers:
        provider.shutdown()
