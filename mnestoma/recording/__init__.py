"""Recording without a call: the in-process tracer, the OpenTelemetry span processor and
the one background writer they share."""
