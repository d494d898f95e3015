"""The tempo plugin: OpenTelemetry traces of every request, exported over OTLP."""
