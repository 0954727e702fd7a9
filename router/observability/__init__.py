"""What the router records about requests: statistics (``stats``), latency histograms, models' custom
metrics, and traces (``tracing``, ``trace_settings``, ``trace_context``; OpenTelemetry: ``otel_*``,
``otlp_export``)."""
