"""What a running ragchains tells operators: OpenTelemetry traces and Prometheus metrics."""
